#!/usr/bin/env bash
# The kernel, attention, fused-stack and parity tests again against the AVX2 and the portable C builds of the
# kernels (the whole suite already ran against -march=native): each through a compiler wrapper that turns the
# wider instructions off, with a kernel cache of its own. No C compiler is a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
. .venv/bin/activate
cc=$(command -v "${CC:-cc}" || command -v gcc || true)
if [ -z "$cc" ]; then
    echo "no C compiler (cc or gcc): the kernels cannot be built or tested" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tests=(tests/native tests/quant tests/attention tests/models
       tests/test_llm.py::test_greedy_parity_with_transformers_alone_and_together
       tests/test_llm.py::test_tiny_random_llama_matches_transformers
       --ignore=tests/native/test_isa_variants.py)  # its own -march builds: the main run has them
for variant in "avx2:-mno-avx512f" "portable:-mno-avx -mno-f16c -mno-fma"; do
    name=${variant%%:*}
    flags=${variant#*:}
    printf '#!/bin/sh\nexec %s "$@" %s\n' "$cc" "$flags" > "$tmp/cc-$name"
    chmod +x "$tmp/cc-$name"
    echo "== the kernels built for $name ($flags)"
    start=$SECONDS
    CC="$tmp/cc-$name" TGI_LLM_KERNEL_CACHE="$tmp/kernels-$name" python -m pytest -q "${tests[@]}"
    echo "== $name: $((SECONDS - start)) s"
done
