#!/usr/bin/env bash
# Set up .venv (first run only), then lint and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup-clients.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check .
python -m pytest -q "$@"
