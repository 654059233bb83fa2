"""The q4/q8 layouts: quantize-on-load accuracy, row/column slices for tensor parallelism, fusion."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tgi_llm.quant.formats import QuantizedWeight, concat_rows, quantize_int4, quantize_int8


def test_int8_and_int4_round_trip_within_half_a_step():
    w = torch.randn(24, 256, generator=torch.Generator().manual_seed(0))
    q8 = quantize_int8(w)
    step8 = (w.amax(1, keepdim=True) - w.amin(1, keepdim=True)) / 255  # asymmetric: the row's range in 255 steps
    # plus the float16 rounding of the scale (<= 128 x 2^-11 steps) and of the min
    assert ((q8.dequantize() - w).abs() <= step8 * 0.63).all()
    assert (step8 <= w.abs().amax(1, keepdim=True) / 127).all()  # never coarser than symmetric absmax int8
    q4 = quantize_int4(w, 64)
    groups = w.view(24, 4, 64)
    step4 = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(64, 1)
    # float16 scales and mins add a rounding of their own: a little over half a step
    assert ((q4.dequantize() - w).abs() <= step4 * 0.55 + 1e-3).all()
    assert q4.nbytes < w.numel() * 4 / 6 and q8.nbytes < w.numel() * 4 / 3.9


@pytest.mark.parametrize("make", [lambda w: quantize_int4(w, 32), lambda w: quantize_int8(w, 32)])
def test_row_and_column_slices_are_the_slices_of_the_dequantized_weight(make):
    w = make(torch.randn(12, 128, generator=torch.Generator().manual_seed(1)))
    dense = w.dequantize()
    assert torch.equal(w.rows(slice(4, 8)).dequantize(), dense[4:8])
    perm = torch.tensor([3, 0, 11, 5])
    assert torch.equal(w.rows(perm).dequantize(), dense[perm])
    assert torch.equal(w.columns(32, 96).dequantize(), dense[:, 32:96])
    with pytest.raises(ValueError, match="group boundaries"):
        w.columns(16, 80)


def test_int8_holds_a_q4_grid_to_a_small_fraction_of_its_step():
    """A Q4_1 model's groups (16 levels, min m, step d) re-quantized to int8 land on 17 x its levels."""
    gen = torch.Generator().manual_seed(3)
    d = (torch.rand(16, 4, 1, generator=gen) * 0.01 + 1e-3).half().float()
    m = (torch.randn(16, 4, 1, generator=gen) * 0.02).half().float()
    levels = torch.randint(0, 16, (16, 4, 32), generator=gen)
    levels[..., 0], levels[..., 1] = 0, 15  # every group spans its whole grid
    w = (levels * d + m).view(16, 128)
    err = (quantize_int8(w, 32).dequantize() - w).abs().view(16, 4, 32)
    assert (err <= d * 0.02).all()  # symmetric int8 errs up to ~d / 17 / 2 here, asymmetric ~100x less


def test_concat_rows_fuses_matching_layouts_only():
    gen = torch.Generator().manual_seed(2)
    a, b = quantize_int4(torch.randn(4, 64, generator=gen)), quantize_int4(torch.randn(2, 64, generator=gen))
    assert torch.equal(concat_rows([a, b]).dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    with pytest.raises(ValueError, match="layouts differ"):
        concat_rows([a, quantize_int8(torch.randn(2, 64, generator=gen))])


def test_malformed_layouts_are_refused():
    codes = torch.zeros(2, 32, dtype=torch.uint8)
    scales = torch.ones(2, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantizedWeight("q4", codes, scales, scales, 16, 64)
    with pytest.raises(ValueError, match="needs mins"):
        QuantizedWeight("q4", codes, scales, None, 32, 64)
    with pytest.raises(ValueError, match="codes must be"):
        QuantizedWeight("q8", codes, scales, None, 32, 64)
    with pytest.raises(ValueError, match="mins must match"):
        QuantizedWeight("q8", torch.zeros(2, 64, dtype=torch.int8), scales, scales[:, :1], 32, 64)
    with pytest.raises(ValueError, match="lanes are for"):
        QuantizedWeight("q8", torch.zeros(2, 64, dtype=torch.int8), scales, None, 32, 64, lanes=2)


def assert_panel_order_slices_like(panel: QuantizedWeight, w: QuantizedWeight) -> None:
    """`panel` (24 x 192, panels of 8) gives the rows, columns and fusions `w` gives, and cannot be cut
    into panels of 16."""
    assert torch.equal(panel.rows(slice(3, 11)).dequantize(), w.dequantize()[3:11])
    ids = torch.tensor([17, 2, 9, 2])  # an embedding lookup: any rows, repeats included
    assert torch.equal(panel.rows(ids).dequantize(), w.dequantize()[ids])
    assert torch.equal(panel.columns(64, 192).dequantize(), w.dequantize()[:, 64:192])
    assert torch.equal(concat_rows([panel, panel]).dequantize(), torch.cat([w.dequantize()] * 2))
    with pytest.raises(ValueError, match="byte order"):
        w.with_order("panel", 16)  # 24 rows: not whole panels of 16


def test_panel_byte_order_holds_the_same_weights():
    w = quantize_int4(torch.randn(24, 192, generator=torch.Generator().manual_seed(5)), 64)
    panel = w.with_order("panel", 8)
    assert panel.codes.shape == w.codes.shape and not torch.equal(panel.codes, w.codes)
    assert not torch.equal(panel.scales, w.scales)  # [N / 8][G][8], not row by row
    assert torch.equal(panel.dequantize(), w.dequantize())
    back = panel.with_order("gguf")
    assert (torch.equal(back.codes, w.codes) and torch.equal(back.scales, w.scales)
            and torch.equal(back.mins, w.mins))
    assert torch.equal(panel.with_order("x8").dequantize(), w.dequantize())
    assert_panel_order_slices_like(panel, w)


@pytest.mark.parametrize("mins", [True, False])
def test_q8_panel_order_holds_the_same_weights(mins):
    w = quantize_int8(torch.randn(24, 192, generator=torch.Generator().manual_seed(6)), 32)
    w = w if mins else replace(w, mins=None)  # symmetric: GGUF's Q8_0
    panel = w.with_order("panel", 8)
    assert panel.codes.shape == w.codes.shape and not torch.equal(panel.codes, w.codes)
    assert torch.equal(panel.codes.view(3, 192, 8)[1, 5], w.codes[8:16, 5])  # [N / 8][K][8]
    assert torch.equal(panel.dequantize(), w.dequantize())
    back = panel.with_order("gguf")
    assert torch.equal(back.codes, w.codes) and torch.equal(back.scales, w.scales)
    assert (back.mins is None) == (w.mins is None)
    assert_panel_order_slices_like(panel, w)


def test_x8_byte_order_holds_the_same_weights():
    w = quantize_int4(torch.randn(6, 192, generator=torch.Generator().manual_seed(4)), 64)
    x8 = w.with_order("x8")
    assert x8.codes.shape == w.codes.shape and not torch.equal(x8.codes, w.codes)
    assert torch.equal(x8.dequantize(), w.dequantize())
    assert torch.equal(x8.with_order("gguf").codes, w.codes)
    assert torch.equal(x8.rows(slice(1, 4)).dequantize(), w.dequantize()[1:4])
    assert torch.equal(x8.columns(64, 192).dequantize(), w.dequantize()[:, 64:192])
    assert torch.equal(x8.columns(128, 192).dequantize(), w.dequantize()[:, 128:192])
    with pytest.raises(ValueError, match="byte order"):
        quantize_int4(torch.randn(2, 96), 32).with_order("x8")
