cd '/work/main' && exec bash scripts/serve.sh --dtype bfloat16
