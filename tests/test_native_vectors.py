"""The C kernel sources (quantized linears, CPU attention, the fused decode stack) built for each
instruction set their shared vectors (native_vectors.py) have code for, not only the one at hand: the
plain-C fallback (no AVX), AVX2 and AVX-512. Each build this CPU can run passes its load-time self-check,
the quantized kernels match a float64 reference at decode and prefill sizes, and the fused stack matches
the torch layers; the others must at least compile."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tgi_llm.attention import cpu_kernels as attention_mod
from tgi_llm.models import fused_decode
from tgi_llm.models.llama import load_model
from tgi_llm.models.rope import rotary_tables
from tgi_llm.native_build import BASE_FLAGS, build_library
from tgi_llm.parallel import tp_ops
from tgi_llm.quant import kernels as kernels_mod
from tgi_llm.quant.formats import quantize_int4, quantize_int8
from tgi_llm.quant.modes import Quantization

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
def test_each_instruction_set_builds_and_computes(tmp_path, use_settings, tiny_model_factory, paged_batcher, isa, march,
                                                  needs):
    use_settings(kernel_cache=tmp_path)
    flags = tuple(march if f == "-march=native" else f for f in BASE_FLAGS)
    path = build_library(f"quant_{isa}", kernels_mod._SOURCE, flags=flags)
    attention_path = build_library(f"attention_{isa}", attention_mod._SOURCE, flags=flags)
    fused_path = build_library(f"fused_{isa}", fused_decode._SOURCE, flags=(*flags, "-ffp-contract=off"))
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
    _check_fused_stack(fused_decode.load_library(fused_path), tiny_model_factory, paged_batcher)


def _check_fused_stack(lib, tiny_model_factory, paged_batcher) -> None:
    """This build's stack (the linears and attention it calls are the machine's) on 9 decode rows with
    contexts of 2-10 tokens, against the torch layers."""
    model, _ = load_model(tiny_model_factory("llama"), quantization=Quantization("int4"))
    first = model.layers[0]
    kv = [tuple(torch.zeros(32, 4, first.num_kv_heads, first.head_dim) for _ in range(2)) for _ in model.layers]
    batcher = paged_batcher(block_size=4, num_blocks=32)
    gen = torch.Generator().manual_seed(3)
    for i in range(9):
        ids, positions, attn = batcher.step([(i, torch.randint(3, 250, (1 + i,), generator=gen).tolist())])
        model(ids, positions, kv, attn)
    ids, positions, attn = batcher.step([(i, [7 + i]) for i in range(9)])
    hidden = tp_ops.embed(ids, model.embed_quant, model.shard)  # int4 on load: the table is quantized too
    cos, sin = rotary_tables(*model.rotary.cos_sin(positions, None), torch.float32)
    stack = fused_decode.FusedDecode(lib, model, kv)
    got = stack._run(hidden.clone(), cos, sin, attn)
    want = model._layers(hidden, cos, sin, kv, attn)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
