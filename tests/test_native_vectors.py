"""Both C kernel sources (quantized linears, CPU attention) built for each instruction set their shared
vectors (native_vectors.py) have code for, not only the one at hand: the plain-C fallback (no AVX), AVX2
and AVX-512. Each build this CPU can run passes its load-time self-check, and the quantized kernels match
a float64 reference at decode and prefill sizes; the others must at least compile."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tgi_llm.attention import cpu_kernels as attention_mod
from tgi_llm.native_build import BASE_FLAGS, build_library
from tgi_llm.quant import kernels as kernels_mod
from tgi_llm.quant.formats import quantize_int4, quantize_int8

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def _cpu_flags() -> set[str]:
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return set()
    return {flag for ln in lines if ln.startswith("flags") for flag in ln.split(":", 1)[1].split()}


CPU_FLAGS = _cpu_flags()
ISAS = [("generic", "-march=x86-64", set()), ("avx2", "-march=haswell", {"avx2", "fma", "f16c"}),
        ("avx512", "-march=skylake-avx512", {"avx512f", "avx512bw", "avx512vl", "avx512dq"})]


@needs_cc
@pytest.mark.skipif(not CPU_FLAGS, reason="not an x86 Linux machine")
@pytest.mark.parametrize(("isa", "march", "needs"), ISAS, ids=[i[0] for i in ISAS])
def test_each_instruction_set_builds_and_computes(tmp_path, monkeypatch, isa, march, needs):
    monkeypatch.setenv("TGI_LLM_KERNEL_CACHE", str(tmp_path))
    flags = tuple(march if f == "-march=native" else f for f in BASE_FLAGS)
    path = build_library(f"quant_{isa}", kernels_mod._SOURCE, flags=flags)
    attention_path = build_library(f"attention_{isa}", attention_mod._SOURCE, flags=flags)
    if not needs <= CPU_FLAGS:
        pytest.skip(f"built; this CPU lacks {sorted(needs - CPU_FLAGS)} to run it")
    attention_mod._self_check(attention_mod.CpuAttentionKernels(attention_path))
    kernels = kernels_mod.QuantKernels(path)
    kernels_mod._self_check(kernels)
    gen = torch.Generator().manual_seed(11)
    for w in (quantize_int4(torch.randn(50, 576, generator=gen)).with_order("x8"),
              quantize_int4(torch.randn(50, 576, generator=gen)), quantize_int8(torch.randn(50, 576, generator=gen))):
        for m in (1, 3, 17):
            x = torch.randn(m, 576, generator=gen)
            want = (x.double() @ w.dequantize().double().T).float()
            for fn in (kernels.linear, kernels.gemm):
                torch.testing.assert_close(fn(x, w), want, rtol=1e-5, atol=1e-4 * (want.abs().max().item() + 1))
