"""The weight-only C kernels against a float64 reference over ragged shapes, and the torch fallback."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import tgi_llm.native.loader as loader
import tgi_llm.quant.kernels as kernels_mod
from tests.native.builds import build_variant
from tgi_llm.native import NativeBuildError
from tgi_llm.native.build import BASE_FLAGS
from tgi_llm.quant.formats import (
    QuantizedWeight,
    bf16_panel_rows,
    from_bf16_panels,
    from_panels,
    panel_rows,
    quantize_int4,
    quantize_int8,
    to_bf16_panels,
    to_panels,
)
from tgi_llm.quant.linear import GEMM_MIN_TOKENS, QuantLinear

kernel = kernels_mod.quant_kernels()
needs_kernel = pytest.mark.usefixtures("c_kernels")  # fails, never skips, without a compiler
LANES = kernel.panel_lanes if kernel is not None else 8
Q8_LANES = kernel.q8_panel_lanes if kernel is not None else 16


def whole_panels(w: torch.Tensor, lanes: int = LANES) -> torch.Tensor:
    """w with rows added up to a multiple of the panel width (odd panel counts included: 33 -> 40 rows)."""
    extra = -w.shape[0] % lanes
    return torch.cat([w, w[:1].expand(extra, -1) * 0.5]) if extra else w

LAYOUTS = [
    ("int4 g32", lambda w: quantize_int4(w, 32)),
    ("int4 g64 fp32 scales", lambda w: quantize_int4(w * 1e5, 64)),  # scales past float16's range
    ("int4 g32 x8 order", lambda w: quantize_int4(w, 32).with_order("x8") if w.shape[1] % 64 == 0 else None),
    ("int4 g128 x8 order", lambda w: quantize_int4(w, 128).with_order("x8") if w.shape[1] % 128 == 0 else None),
    ("int4 g32 panel order", lambda w: quantize_int4(whole_panels(w), 32).with_order("panel", LANES)),
    ("int4 g64 fp32 scales panel order",
     lambda w: quantize_int4(whole_panels(w) * 1e5, 64).with_order("panel", LANES)),
    ("int8 per channel", lambda w: quantize_int8(w)),
    ("int8 g16", lambda w: quantize_int8(w, 16)),
    ("int8 g32 fp32 scales", lambda w: quantize_int8(w * 1e5, 32)),
    ("symmetric q8 g32 (Q8_0)", lambda w: symmetric_q8(w, 32)),
    ("symmetric q8 g16 fp32 scales (Q6_K)", lambda w: symmetric_q8(w, 16, torch.float32)),
    ("int8 g16 panel order", lambda w: quantize_int8(whole_panels(w, Q8_LANES), 16).with_order("panel", Q8_LANES)),
    ("int8 g32 fp32 scales panel order",
     lambda w: quantize_int8(whole_panels(w, Q8_LANES) * 1e5, 32).with_order("panel", Q8_LANES)),
    ("symmetric q8 g32 panel order (Q8_0)",
     lambda w: symmetric_q8(whole_panels(w, Q8_LANES), 32).with_order("panel", Q8_LANES)),
]


def symmetric_q8(w: torch.Tensor, group: int, dtype: torch.dtype = torch.float16) -> QuantizedWeight:
    """The layout GGUF's Q8_0 and Q6_K load into: no mins."""
    n, k = w.shape
    scales = (w.view(n, k // group, group).abs().amax(-1) / 127).to(dtype)
    codes = torch.round(w.view(n, k // group, group) / scales.float()[..., None]).clamp(-127, 127)
    return QuantizedWeight("q8", codes.to(torch.int8).view(n, k), scales, None, group, k, source="Q8_0")


@pytest.fixture
def avx_gemms():
    """The AVX GEMMs even where AMX tiles would take these rows (tests/quant/test_kernels_amx.py covers them)."""
    kernel.set_amx_min_rows(0)
    yield
    kernel.set_amx_min_rows(kernels_mod.AMX_MIN_ROWS if kernel.amx else 0)


def assert_matches_float64(fn, name, make, n, k, m):
    """`fn` (a kernel entry point) on an [m, k] input and an [n, k] weight of layout `make` against float64."""
    gen = torch.Generator().manual_seed(n * 1000 + k + m)
    w = make(torch.randn(n, k, generator=gen))
    if w is None:
        pytest.skip(f"{name} needs in_features divisible by its block")
    x = torch.randn(m, k, generator=gen)
    want = (x.double() @ w.dequantize().double().T).float()
    scale = want.abs().max().item() + 1
    torch.testing.assert_close(fn(x, w), want, rtol=1e-5, atol=1e-5 * scale)


@needs_kernel
@pytest.mark.parametrize(("name", "make"), LAYOUTS)
@pytest.mark.parametrize(("n", "k"), [(1, 64), (17, 128), (64, 192), (130, 576)])
@pytest.mark.parametrize("m", [*range(1, 19), 29])
def test_linear_matches_float64_reference(name, make, n, k, m):
    """Every number of rows per pass (up to 3 on AVX2; 12 on AVX-512, 16 for q4 panels one panel at a time)
    and passes with a partial last one."""
    assert_matches_float64(kernel.linear, name, make, n, k, m)


@needs_kernel
@pytest.mark.parametrize(("name", "make"), LAYOUTS)
@pytest.mark.parametrize(("n", "k"), [(1, 64), (33, 128), (70, 576), (16, 1536)])
@pytest.mark.parametrize("m", [1, 5, 6, 7, 13, 40])
def test_gemm_matches_float64_reference(name, make, n, k, m):
    """Panels narrower than the kernel's, K past one panel (576 = 256 + 256 + 64), every row-tile tail."""
    assert_matches_float64(kernel.gemm, name, make, n, k, m)


@needs_kernel
@pytest.mark.parametrize(("name", "make"), LAYOUTS)
def test_gemm_dequantizes_bit_exactly_like_torch(name, make):
    """Multiplying by the identity returns the kernel's dequantized weights: they equal torch's bit for bit."""
    w = make(torch.randn(45, 640, generator=torch.Generator().manual_seed(3)))
    assert w is not None
    assert torch.equal(kernel.gemm(torch.eye(640), w), w.dequantize().T)


@needs_kernel
@pytest.mark.parametrize(("n", "k"), [(1, 64), (17, 128), (70, 576), (130, 1536), (Q8_LANES, 64), (3 * Q8_LANES, 576)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 9, 13])
@pytest.mark.parametrize("gemm_min", [0, 100])  # the GEMM, and the decode kernel (4 / 2 / 1 rows per pass)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("panel", [False, True])
def test_float32_weights_match_float64_reference(n, k, m, gemm_min, with_bias, panel):
    if panel and n % Q8_LANES:
        pytest.skip("the panel order needs whole panels")
    gen = torch.Generator().manual_seed(n * 1000 + k + m)
    w, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen) if with_bias else None
    wide = torch.randn(m, k + 24, generator=gen)
    x = wide[:, 8:k + 8]  # rows with a stride wider than k
    want = x.double() @ w.double().T + (0 if bias is None else bias.double())
    held = to_panels(w, Q8_LANES) if panel else w
    got = kernel.apply(x, kernels_mod.dense_desc(held, bias, panel=panel), gemm_min)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5 * (want.abs().max().item() + 1))


def test_float_panels_round_trip():
    w = torch.randn(48, 32)
    panels = to_panels(w, 16)
    assert torch.equal(panels.view(3, 32, 16)[1, 5], w[16:32, 5]) and torch.equal(from_panels(panels, 16), w)
    ids = torch.tensor([47, 0, 16, 16, 5, 31])  # an embedding lookup: any rows, repeats included
    assert torch.equal(panel_rows(panels, ids, 16), w[ids])


@needs_kernel
@pytest.mark.parametrize(("n", "k"), [(2 * 32, 64), (96, 576), (576, 1536)])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 17, 130])  # partial, whole and several row tiles
@pytest.mark.parametrize("with_bias", [False, True])
def test_bfloat16_weights_match_the_products_of_bfloat16_operands(n, k, m, with_bias):
    """--dtype bfloat16 on the CPU: weights and activations rounded to bfloat16 (to nearest even), their
    products summed in float32; rows with a stride wider than K."""
    if n % Q8_LANES:
        pytest.skip("the bfloat16 order needs whole panels")
    gen = torch.Generator().manual_seed(n + k + m)
    w, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen) if with_bias else None
    x = torch.randn(m, k + 24, generator=gen)[:, 8:k + 8]
    want = x.bfloat16().double() @ w.bfloat16().double().T + (0 if bias is None else bias.double())
    held = to_bf16_panels(w, Q8_LANES)  # alive while its descriptor (raw pointers) is used
    got = kernel.apply(x, kernels_mod.dense_desc(held, bias, panel=True), 0)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * (want.abs().max().item() + 1))


@needs_kernel
def test_bfloat16_without_the_bf16_instructions_gives_the_same_products(avx_gemms):
    """The library built without AVX512-BF16 (what a CPU without it runs: shifts and FMAs) against the one
    built for this CPU, on the same bfloat16 weights (its AVX-512 kernel: AMX tiles sum in another order)."""
    try:
        plain = kernels_mod.LinearKernels(build_variant("kernels_no_bf16", flags=BASE_FLAGS + ("-mno-avx512bf16",)))
    except NativeBuildError:
        pytest.skip("the compiler does not take -mno-avx512bf16")
    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(3 * Q8_LANES, 576, generator=gen), torch.randn(11, 576, generator=gen)
    held = to_bf16_panels(w, Q8_LANES)
    desc = kernels_mod.dense_desc(held, panel=True)
    torch.testing.assert_close(plain.apply(x, desc, 0), kernel.apply(x, desc, 0), rtol=1e-6, atol=1e-6)


CODES_FOR_BF16 = {
    "q4 g32, odd panels": lambda w: quantize_int4(w[:3 * LANES], 32).with_order("panel", LANES),
    "q4 g64 fp32 scales": lambda w: quantize_int4(w * 1e5, 64).with_order("panel", LANES),
    "q8 asymmetric": lambda w: quantize_int8(w, 32).with_order("panel", Q8_LANES),
    "q8 symmetric": lambda w: replace(quantize_int8(w, 32), mins=None).with_order("panel", Q8_LANES),
}


@needs_kernel
@pytest.mark.parametrize("layout", CODES_FOR_BF16)
@pytest.mark.parametrize("m", [1, 15, 16, 40])
def test_bfloat16_products_from_codes_are_the_bfloat16_weights_products(layout, m, avx_gemms):
    """--dtype bfloat16 with quantized weights: from `bf16_min_rows` rows the panel GEMM rounds each
    dequantized chunk and the activations to bfloat16, bit for bit what the bfloat16 weights' GEMM computes
    over the same weights (K = 576: two whole k-chunks and a partial one); below, the float32 kernels."""
    gen = torch.Generator().manual_seed(m)
    qw = CODES_FOR_BF16[layout](torch.randn(2 * Q8_LANES, 576, generator=gen))
    x = torch.randn(m, 600, generator=gen)[:, 10:586]  # rows with a stride wider than K
    got = kernel.apply(x, kernels_mod.quantized_desc(qw, None, 16), 0)
    if m < 16:
        assert torch.equal(got, kernel.apply(x, kernels_mod.quantized_desc(qw), 0))
        return
    dense = qw.dequantize()
    want = x.bfloat16().double() @ dense.bfloat16().double().T
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * (want.abs().max().item() + 1))
    if qw.out_features % Q8_LANES == 0:
        held = to_bf16_panels(dense, Q8_LANES)
        assert torch.equal(got, kernel.apply(x, kernels_mod.dense_desc(held, panel=True), 0))
    assert not torch.equal(got, kernel.apply(x, kernels_mod.quantized_desc(qw), 0))  # float32 products differ


def test_bfloat16_panels_round_trip():
    w = torch.randn(64, 48)
    panels = to_bf16_panels(w, 16)
    assert panels.dtype == torch.bfloat16 and panels.shape == w.shape
    pairs = panels.view(4, 24, 16, 2)  # [panel][k-pair][row][2]
    assert torch.equal(pairs[1, 5, 3].float(), w[16 + 3, 10:12].bfloat16().float())
    assert torch.equal(from_bf16_panels(panels, 16), w.bfloat16().float())
    ids = torch.tensor([0, 17, 63, 17])  # a tied embedding's lookup reads rows from the panels
    assert torch.equal(bf16_panel_rows(panels, ids, 16), w[ids].bfloat16().float())


def panel_gemm_call(layout: str, w: torch.Tensor):
    """The kernel call for `layout` and the weight it holds (alive while its raw pointers are used)."""
    if layout == "q4 panel":
        qw = quantize_int4(w, 32).with_order("panel", LANES)
        return (lambda x: kernel.gemm(x, qw)), qw.dequantize()
    if layout == "q8 panel":
        qw = quantize_int8(w, 16).with_order("panel", Q8_LANES)
        return (lambda x: kernel.gemm(x, qw)), qw.dequantize()
    held = to_bf16_panels(w, Q8_LANES) if layout == "bfloat16 panel" else to_panels(w, Q8_LANES)
    desc = kernels_mod.dense_desc(held, panel=True)
    return (lambda x: kernel.apply(x, desc, 0)), held


@needs_kernel
@pytest.mark.parametrize("layout", ["q4 panel", "q8 panel", "float32 panel", "bfloat16 panel"])
def test_gemm_rows_past_one_cache_block_match_each_row_alone(layout, avx_gemms):
    """K = 8192: a row's activations take 32 KB (16 KB as bfloat16), so 150 rows span several of the GEMM's
    row blocks (sized to half of L2: 64 rows on CPUs with up to 4 MB of it), the last one partial. Every row
    equals the same row multiplied alone, bit for bit, and the float64 reference. (On AMX CPUs 150 rows
    would take the tiles: `avx_gemms`.)"""
    gen = torch.Generator().manual_seed(11)
    w, x = torch.randn(2 * Q8_LANES, 8192, generator=gen), torch.randn(150, 8192, generator=gen)
    fn, held = panel_gemm_call(layout, w)
    got = fn(x)
    for i in (0, 63, 64, 127, 128, 149):
        assert torch.equal(fn(x[i:i + 1]), got[i:i + 1]), f"row {i}"
    if layout == "bfloat16 panel":
        want = x.bfloat16().double() @ w.bfloat16().double().T
    else:
        want = x.double() @ (w if layout == "float32 panel" else held).double().T
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * (want.abs().max().item() + 1))


@needs_kernel
def test_strided_rows_and_batch_independence():
    """Rows of a wider activation (a view) work, and a row's result does not depend on its batch-mates."""
    gen = torch.Generator().manual_seed(5)
    w = quantize_int4(torch.randn(96, 128, generator=gen)).with_order("x8")
    wide = torch.randn(7, 200, generator=gen)
    x = wide[:, 10:138]
    together = kernel.linear(x, w)
    for i in range(7):
        assert torch.equal(kernel.linear(x[i:i + 1].contiguous(), w)[0], together[i])


@pytest.mark.parametrize("tokens", [1, GEMM_MIN_TOKENS + 3])
def test_quant_linear_serves_without_the_kernel(monkeypatch, tokens):
    """The torch fallback (no compiler, failed self-check, TGI_LLM_QUANT_KERNELS=0) gives the same result."""
    gen = torch.Generator().manual_seed(7)
    w, bias = quantize_int4(torch.randn(40, 64, generator=gen)), torch.randn(40, generator=gen)
    x = torch.randn(tokens, 64, generator=gen)
    want = torch.nn.functional.linear(x.double(), w.dequantize().double(), bias.double()).float()
    fast = QuantLinear(w, bias)
    monkeypatch.setattr(kernels_mod.quant_kernels, "value", None)
    monkeypatch.setattr(kernels_mod.quant_kernels, "decided", True)
    slow = QuantLinear(w, bias)
    assert slow.kernels is None
    torch.testing.assert_close(slow(x), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(fast(x), want, rtol=1e-5, atol=1e-4)


def test_switched_off_by_environment(monkeypatch, use_settings):
    use_settings(quant_kernels=False)
    monkeypatch.setattr(kernels_mod.quant_kernels, "value", None)  # restored after the test, with `decided`
    monkeypatch.setattr(kernels_mod.quant_kernels, "decided", False)
    assert kernels_mod.quant_kernels() is None


def test_a_failed_build_means_the_torch_path(monkeypatch, use_settings, caplog):
    def broken(*_a, **_k):
        raise NativeBuildError("no compiler here")

    monkeypatch.setattr(loader, "library_path", broken)
    monkeypatch.setattr(loader, "_outcome", None)  # not tried yet
    monkeypatch.setattr(kernels_mod.quant_kernels, "value", None)  # restored after the test, with `decided`
    monkeypatch.setattr(kernels_mod.quant_kernels, "decided", False)
    use_settings(quant_kernels=True)
    assert kernels_mod.quant_kernels() is None
    assert "no compiler here" in caplog.text


@needs_kernel
def test_quant_linear_uses_the_kernels_byte_order_and_the_tied_table_follows(tiny_model_factory):
    from tgi_llm.models import load_model
    from tgi_llm.quant.modes import Quantization

    model, _ = load_model(tiny_model_factory("llama", tie_word_embeddings=True), quantization=Quantization("int4"))
    gate_up = model.layers[0].gate_up.qweight
    want = "panel" if gate_up.out_features % LANES == 0 else "x8"  # whole panels, else in_features 64: x8
    assert gate_up.order == want
    assert model.embed_quant.codes.data_ptr() == model.lm_head_quant.qweight.codes.data_ptr()
