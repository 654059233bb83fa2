cd '/tmp/peerclone' && exec bash scripts/serve.sh 
