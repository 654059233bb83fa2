cd '/work/main' && exec bash scripts/serve.sh --speculate 0 --speculate 4
