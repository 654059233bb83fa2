"""The kernels library built for each instruction set its shared vectors (csrc/include/vectors.h) have code for,
not only the one at hand: the plain-C fallback (no AVX), AVX2 and AVX-512. Each build this CPU can run passes
every registered self-check (tgi_llm.native.loader.REGISTRY), the quantized kernels match a float64 reference
at decode and prefill sizes, and the fused stack matches the torch layers; the others must at least compile,
without a warning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.native.builds import build_variant, with_march
from tgi_llm.attention.cpu_kernels import CpuAttentionKernels, cpu_attention_kernels
from tgi_llm.attention.cpu_kernels import _self_check as attention_self_check
from tgi_llm.models import layer_stack
from tgi_llm.models.layers.rotary import rotary_tables
from tgi_llm.models.loader import load_model
from tgi_llm.native.loader import REGISTRY
from tgi_llm.parallel import tp_ops
from tgi_llm.quant.formats import quantize_int4, quantize_int8
from tgi_llm.quant.kernels import LinearKernels, quant_kernels
from tgi_llm.quant.modes import Quantization


def _cpu_flags() -> set[str]:
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return set()
    return {flag for ln in lines if ln.startswith("flags") for flag in ln.split(":", 1)[1].split()}


CPU_FLAGS = _cpu_flags()
ISAS = [("generic", "-march=x86-64", set()), ("avx2", "-march=haswell", {"avx2", "fma", "f16c"}),
        ("avx512", "-march=skylake-avx512", {"avx512f", "avx512bw", "avx512vl", "avx512dq"})]


@pytest.mark.skipif(not CPU_FLAGS, reason="not an x86 Linux machine")
@pytest.mark.parametrize(("isa", "march", "needs"), ISAS, ids=[i[0] for i in ISAS])
def test_each_instruction_set_builds_and_computes(tmp_path, use_settings, caplog, monkeypatch, c_kernels,
                                                  tiny_model_factory, paged_batcher, isa, march, needs):
    use_settings(kernel_cache=tmp_path)
    if not needs <= CPU_FLAGS:
        from tgi_llm.native.build import build_library

        build_library(f"kernels_{isa}", flags=with_march(march))
        assert "printed while building" not in caplog.text
        pytest.skip(f"built; this CPU lacks {sorted(needs - CPU_FLAGS)} to run it")
    lib = build_variant(f"kernels_{isa}", flags=with_march(march))
    assert "printed while building" not in caplog.text
    for family in REGISTRY:
        family.check(family.make(lib))
    attention = CpuAttentionKernels(lib)
    attention_self_check(attention)
    kernels = LinearKernels(lib)
    for family, value in ((quant_kernels, kernels), (cpu_attention_kernels, attention)):  # the model's load takes them
        monkeypatch.setattr(family, "value", value)
        monkeypatch.setattr(family, "decided", True)
    gen = torch.Generator().manual_seed(11)
    for w in (quantize_int4(torch.randn(50, 576, generator=gen)).with_order("x8"),
              quantize_int4(torch.randn(50, 576, generator=gen)), quantize_int8(torch.randn(50, 576, generator=gen))):
        for m in (1, 3, 17):
            x = torch.randn(m, 576, generator=gen)
            want = (x.double() @ w.dequantize().double().T).float()
            for fn in (kernels.linear, kernels.gemm):
                torch.testing.assert_close(fn(x, w), want, rtol=1e-5, atol=1e-4 * (want.abs().max().item() + 1))
    _check_fused_stack(lib, tiny_model_factory, paged_batcher)


def _check_fused_stack(lib, tiny_model_factory, paged_batcher) -> None:
    """This build's stack (with this build's linears and attention) on 9 decode rows with contexts of 2-10 tokens,
    against the torch layers."""
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
    stack = layer_stack.FusedLayerStack(lib, model, kv)
    got = stack._run(hidden.clone(), {"global": (cos, sin)}, attn)
    want = model._layers(hidden, {"global": (cos, sin)}, kv, attn)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
