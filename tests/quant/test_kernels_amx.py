"""The panel GEMMs on AMX tiles (quant/kernels.py, where the CPU has AMX-BF16): float32 accuracy from split
bfloat16 operands, every tail of rows, columns and k, and the dispatch by row count. Skipped elsewhere."""

from __future__ import annotations

import threading

import pytest
import torch

import tgi_llm.quant.kernels as kernels_mod
from tgi_llm.quant.formats import quantize_int4, quantize_int8, to_bf16_panels, to_panels

kernel = kernels_mod.quant_kernels()
pytestmark = pytest.mark.skipif(kernel is None or not kernel.amx, reason="no AMX-BF16 tiles on this CPU")
LANES = kernel.panel_lanes if kernel is not None else 16
Q8_LANES = kernel.q8_panel_lanes if kernel is not None else 32


@pytest.fixture
def on_tiles():
    """Every panel GEMM of these tests on the tile unit, from one row; the default threshold afterwards."""
    kernel.set_amx_min_rows(1)
    yield
    kernel.set_amx_min_rows(kernels_mod.AMX_MIN_ROWS)


def held(layout: str, w: torch.Tensor) -> tuple[kernels_mod.WeightDesc, torch.Tensor, object]:
    """(descriptor, the float weight it multiplies, what must stay alive) of w in one of the panel layouts."""
    if layout == "float32 panel":
        t = to_panels(w, Q8_LANES)
        return kernels_mod.dense_desc(t, panel=True), w, t
    q = {"q4 g32": lambda: quantize_int4(w, 32).with_order("panel", LANES),
         "q4 g64 fp32 scales": lambda: quantize_int4(w * 1e5, 64).with_order("panel", LANES),
         "q8 g32 asymmetric": lambda: quantize_int8(w, 32).with_order("panel", Q8_LANES),
         "q8 g16 symmetric": lambda: symmetric(quantize_int8(w, 16)).with_order("panel", Q8_LANES)}[layout]()
    return kernels_mod.quantized_desc(q), q.dequantize(), q


def symmetric(q):
    from dataclasses import replace

    return replace(q, mins=None)


LAYOUTS = ["q4 g32", "q4 g64 fp32 scales", "q8 g32 asymmetric", "q8 g16 symmetric", "float32 panel"]


def gemm(desc, x):
    return kernel.apply(x, desc, 0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("n", "k"), [(32, 64), (96, 576), (64, 1536), (4096, 128)])
@pytest.mark.parametrize("m", [1, 15, 16, 17, 40, 300])
def test_tiles_are_as_accurate_as_the_float32_gemm(on_tiles, layout, n, k, m):
    """Against float64: within float32's tolerance, and no further off than the AVX GEMM (products dropped
    from the split, or summed into the large accumulator, would be ~2^8 further off). 4,096 columns span
    several of a thread's weight groups; 300 rows several row blocks; odd panel counts a single last tile."""
    if layout.startswith("q4") and n % (2 * LANES) == 0:
        n += LANES  # an odd number of q4 panels: the last column pair is one tile
    gen = torch.Generator().manual_seed(n * 7 + k + m)
    desc, dense, _keep = held(layout, torch.randn(n, k, generator=gen))
    assert_as_accurate(*tiles_avx_float64(gemm, desc, dense, torch.randn(m, k, generator=gen)))


def tiles_avx_float64(entry, desc, dense, x):
    """x through `entry` on the tiles (the fixture's setting), then on the AVX kernels, and in float64."""
    got = entry(desc, x).double()
    kernel.set_amx_min_rows(0)
    return got, entry(desc, x).double(), x.double() @ dense.double().T


def assert_as_accurate(got, avx, want):
    scale = want.abs().max().item() + 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)
    assert (got - want).abs().max() <= 2 * (avx - want).abs().max() + 1e-6 * scale


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_identity_returns_the_dequantized_weights_exactly(on_tiles, layout):
    """x = I: each split part of a weight times 1, summed: the weight bit for bit, so no part is lost."""
    desc, dense, _keep = held(layout, torch.randn(3 * Q8_LANES, 192, generator=torch.Generator().manual_seed(2)))
    assert torch.equal(gemm(desc, torch.eye(192)), dense.T)


def test_float32_weights_with_k_past_the_last_whole_tile(on_tiles):
    """K = 80: the last k-tile holds 16 real columns, the rest zero on both sides."""
    gen = torch.Generator().manual_seed(4)
    w, x = torch.randn(Q8_LANES, 80, generator=gen), torch.randn(33, 80, generator=gen)
    desc, _, _keep = held("float32 panel", w)
    torch.testing.assert_close(gemm(desc, x).double(), x.double() @ w.double().T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["q4 g32", "float32 panel"])
def test_a_row_does_not_depend_on_its_batch_or_the_thread_count(on_tiles, layout):
    gen = torch.Generator().manual_seed(6)
    desc, _, _keep = held(layout, torch.randn(4 * Q8_LANES, 576, generator=gen))
    wide = torch.randn(37, 600, generator=gen)
    x = wide[:, 10:586]  # strided rows
    together = gemm(desc, x)
    for i in (0, 15, 16, 36):
        assert torch.equal(gemm(desc, x[i:i + 1]), together[i:i + 1]), f"row {i}"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(gemm(desc, x), together)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("m", [1, 16, 17, 33, 100])
def test_bfloat16_weights_on_tiles_take_the_products_of_bfloat16_operands(on_tiles, m):
    gen = torch.Generator().manual_seed(m)
    w, x = torch.randn(3 * Q8_LANES, 576, generator=gen), torch.randn(m, 576, generator=gen)
    t = to_bf16_panels(w, Q8_LANES)
    want = x.bfloat16().double() @ w.bfloat16().double().T
    got = gemm(kernels_mod.dense_desc(t, panel=True), x).double()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * (want.abs().max().item() + 1))


def test_concurrent_callers_share_the_scratch_safely(on_tiles):
    """ctypes releases the GIL: two threads multiplying at once must not split into each other's scratch."""
    gen = torch.Generator().manual_seed(8)
    cases = []
    for n, k, m in ((Q8_LANES * 6, 576, 150), (Q8_LANES * 2, 1536, 90)):
        desc, dense, keep = held("float32 panel", torch.randn(n, k, generator=gen))
        x = torch.randn(m, k, generator=gen)
        cases.append((desc, x, gemm(desc, x), keep))
    failures = []

    def worker(case):
        desc, x, want, _ = case
        for _ in range(20):
            if not torch.equal(gemm(desc, x), want):
                failures.append("mismatch")

    threads = [threading.Thread(target=worker, args=(c,)) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


@pytest.mark.parametrize(("layout", "rows"), [("q4 g32", kernels_mod.AMX_MIN_ROWS),
                                              ("bfloat16 panel", kernels_mod.AMX_BF16_MIN_ROWS)])
def test_rows_below_the_threshold_keep_the_avx_gemm(layout, rows):
    """The default dispatch: fewer rows than the layout's threshold give the AVX GEMM's result bit for bit,
    that many the tiles' (which differ from it in rounding)."""
    gen = torch.Generator().manual_seed(9)
    w = torch.randn(2 * Q8_LANES, 576, generator=gen)
    if layout == "bfloat16 panel":
        keep = to_bf16_panels(w, Q8_LANES)
        desc = kernels_mod.dense_desc(keep, panel=True)
    else:
        desc, _, keep = held(layout, w)
    x = torch.randn(rows, 576, generator=gen)
    kernel.set_amx_min_rows(0)
    try:
        avx = gemm(desc, x)
        kernel.set_amx_min_rows(1)
        tiles = gemm(desc, x)
    finally:
        kernel.set_amx_min_rows(kernels_mod.AMX_MIN_ROWS)
    assert not torch.equal(avx, tiles)  # else this test could not tell the paths apart
    assert torch.equal(gemm(desc, x[:rows - 1]), avx[:rows - 1])
    assert torch.equal(gemm(desc, x), tiles)


def test_switched_off_by_environment(monkeypatch, use_settings):
    use_settings(amx=False)
    monkeypatch.setattr(kernels_mod.quant_kernels, "value", None)  # restored after the test, with `decided`
    monkeypatch.setattr(kernels_mod.quant_kernels, "decided", False)
    try:
        other = kernels_mod.quant_kernels()
        assert other is not None and not other.amx
    finally:
        kernel.set_amx_min_rows(kernels_mod.AMX_MIN_ROWS)  # the library, and so the setting, is process-wide


def decode(desc, x):
    """The decode branch of `quant_apply` (fewer rows than the GEMM's), where q4 codes may take the tiles."""
    return kernel.apply(x, desc, 17)


@pytest.mark.parametrize("layout", ["q4 g32", "q4 g64 fp32 scales"])
@pytest.mark.parametrize(("n", "k"), [(16, 64), (48, 576), (80, 1536)])
@pytest.mark.parametrize("m", [1, 7, 12, 16])
def test_q4_decode_rows_on_tiles_are_as_accurate_as_the_decode_kernel(on_tiles, layout, n, k, m):
    """`amx_q4_rows`: one row tile (rows past m zero), turns of three column tiles (80 columns: a turn of
    three and one of two), groups of one and two k-blocks, float16 and float32 scales."""
    gen = torch.Generator().manual_seed(n + k + m)
    desc, dense, _keep = held(layout, torch.randn(n, k, generator=gen))
    got, avx, want = tiles_avx_float64(decode, desc, dense, torch.randn(m, k, generator=gen))
    assert not torch.equal(got, avx) or m == 1  # else the tiles were not taken (one row may round alike)
    assert_as_accurate(got, avx, want)


def test_q4_decode_rows_of_the_identity_return_the_weights_exactly(on_tiles):
    desc, dense, _keep = held("q4 g32", torch.randn(5 * LANES, 192, generator=torch.Generator().manual_seed(3)))
    for rows in (slice(0, 16), slice(176, 192), slice(40, 45)):
        assert torch.equal(decode(desc, torch.eye(192)[rows]), dense.T[rows])


def test_q4_decode_rows_take_the_tiles_from_their_threshold():
    """The default dispatch: below AMX_Q4_ROWS_MIN rows the AVX-512 decode kernel's result bit for bit,
    from there to 16 rows the tiles', from 17 the GEMM's."""
    gen = torch.Generator().manual_seed(11)
    desc, _, _keep = held("q4 g32", torch.randn(4 * LANES, 576, generator=gen))
    x = torch.randn(16, 576, generator=gen)
    first = kernels_mod.AMX_Q4_ROWS_MIN
    kernel.set_amx_min_rows(0)
    try:
        avx = [decode(desc, x[:m]) for m in (first - 1, first, 16)]
        kernel.set_amx_min_rows(1)
        tiles = [decode(desc, x[:m]) for m in (first, 16)]
    finally:
        kernel.set_amx_min_rows(kernels_mod.AMX_MIN_ROWS)
    assert not torch.equal(avx[2], tiles[1])  # else this test could not tell the paths apart
    assert torch.equal(decode(desc, x[:first - 1]), avx[0])
    assert torch.equal(decode(desc, x[:first]), tiles[0])
    assert torch.equal(decode(desc, x), tiles[1])
