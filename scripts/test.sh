#!/usr/bin/env bash
# Set up .venv (first run only), then lint and run the whole test suite (and the kernels' tests per ISA build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup-clients.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check .
python -m pytest -q "$@"
# A full run (no arguments) also tests the AVX2 and the portable C builds of the kernels.
if [ $# -eq 0 ]; then
    bash scripts/test-isa-variants.sh
fi
