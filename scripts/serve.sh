#!/usr/bin/env bash
# Set up .venv (first run only) and serve the default model: Triton HTTP :8000, gRPC :8001, metrics :8002.
# Any argument goes to tgi-llm-launcher, e.g. `bash scripts/serve.sh --model-id /path/to/model --http-port 9000`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tgi-llm-launcher "$@"
