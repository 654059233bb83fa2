cd '/tmp/peerclone' && exec bash scripts/serve.sh --quantize float --dtype bfloat16
