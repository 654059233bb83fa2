#!/bin/bash
# AVX2 proxy on the Zen 5: our kernels built without AVX-512, torch/oneDNN/MKL capped at AVX2; llama.cpp's harness build is AVX2 already
export CC=/tmp/cc-avx2 TGI_LLM_KERNEL_CACHE=/tmp/kc-avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
cd /work/main
ROUNDS=2 OUT=/tmp/peers-avx2 bash ../shared/peers/run.sh . ours llama-q4_1 llama-f32 vllm-fp32 > /tmp/peers-avx2.log 2>&1
ROUNDS=2 OUT=/tmp/peers-avx2-int8 OURS_ARGS="--quantize int8" bash ../shared/peers/run.sh . ours llama-q8_0 > /tmp/peers-avx2-int8.log 2>&1
ROUNDS=2 OUT=/tmp/peers-avx2-f32 OURS_ARGS="--quantize float" bash ../shared/peers/run.sh . ours llama-f32 > /tmp/peers-avx2-f32.log 2>&1
