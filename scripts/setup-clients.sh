#!/usr/bin/env bash
# Create .venv-clients/ with third-party client programs the tests run against a real server, apart from
# .venv: lm-evaluation-harness needs numpy 2 (pandas, pyarrow), which the server's environment cannot
# take (nvidia-pytriton pins numpy < 2). Idempotent; no torch (lm-eval's API models need none).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
stamp=".venv-clients/.setup-$(sha1sum scripts/setup-clients.sh | cut -c1-16)"
[ -f "$stamp" ] && exit 0
echo "[setup-clients] installing lm-eval into .venv-clients (one time, ~2 minutes)" >&2
[ -x .venv-clients/bin/python ] || "$PYTHON" -m venv .venv-clients
.venv-clients/bin/python -m pip install -q --upgrade pip
.venv-clients/bin/python -m pip install -q "lm_eval[api]==0.4.13" "transformers>=4.46"
rm -f .venv-clients/.setup-*
touch "$stamp"
echo "[setup-clients] done" >&2
