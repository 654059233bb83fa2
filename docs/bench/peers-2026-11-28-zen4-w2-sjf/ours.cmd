cd '/work/main' && exec bash scripts/serve.sh 
