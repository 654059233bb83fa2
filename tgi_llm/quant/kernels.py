"""Weight-only quantized linears in C: read the 4-/8-bit codes, dequantize in registers or L1, fp32 FMA.

At a few tokens per step a linear is a stream of weight bytes; reading 4.5-8.5 bits per weight instead
of 32 is what makes a GGUF model fast (llama.cpp reads its Q4_1 file as it is). Activations stay float32
and every product is accumulated in float32, so the result is the float linear over the exactly
dequantized weights up to summation order (no activation quantization, unlike ggml's integer dots).

Two kernels, chosen by the number of activation rows (QuantLinear):
- `linear`, for decode: per output row and group s = sum(q * x) over the group's codes (converted to
  float in registers), y += scale * s, plus, for q4 and asymmetric int8, min * sum(x over the group) (x's
  group sums computed once per call); each row's codes are read once for up to 3-4 activation rows.
- `gemm`, for batches and prefill chunks: each thread dequantizes a panel of weights into L1 (exactly as
  torch does), k-major, and a register-blocked micro-kernel multiplies it with all activation rows.
q4 and q8 weights in the "panel" byte order (formats.py; VL output rows side by side, so one vector holds
one k of VL rows) go through `q4p_linear` / `q8p_linear` / `panel_gemm`, which need no horizontal sums and
no transposes; the others through the row-by-row kernels. Float32 weights in the panel order (models/layers/linear.py
`Linear`) are already the micro-kernel's layout: `panel_gemm` reads them in place at every row count.
Rows are split over OpenMP threads. The code uses AVX2 or AVX-512 intrinsics where -march=native
(tgi_llm.native) has them and GCC vectors elsewhere; float16 scales go through F16C where the CPU has it.
Where the CPU has AMX-BF16 (Intel Xeon from Sapphire Rapids on), the panel orders' GEMMs run on the tile
unit from AMX_MIN_ROWS rows: float32 operands split into bfloat16 parts keep float32's accuracy there, and
bfloat16 weights (--dtype bfloat16) are the tiles' operand as they are. q4 codes take the tiles at decode
rows too (AMX_Q4_ROWS_MIN to 16), the codes themselves the weight operand (exact in bfloat16).

The C source is tgi_llm/csrc/quant/linear.c, built at model load by `tgi_llm.native`, checked against the
torch reference, optional: when it is unavailable (no compiler, failed check, TGI_LLM_QUANT_KERNELS=0)
QuantLinear dequantizes in torch.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import replace

import torch

from tgi_llm.native import CheckedKernels
from tgi_llm.native.abi import WeightDesc, WeightKind
from tgi_llm.quant.formats import QuantizedWeight, to_bf16_panels, to_panels
from tgi_llm.settings import settings

logger = logging.getLogger(__name__)

#: Activation rows from which the panel GEMMs run on AMX tiles, where the CPU has them: below, splitting the
#: weights into bfloat16 parts (once per call) costs more than the tiles save (measured crossover: ~72 rows).
AMX_MIN_ROWS = 80
#: The same for bfloat16 weights, the tiles' own operand (nothing to split): below 4 rows both are a stream of
#: weight bytes.
AMX_BF16_MIN_ROWS = 4
#: Rows from which (to 16) q4 panel codes take the tile unit below the GEMM (`amx_q4_rows`, whose cost hardly
#: depends on the rows: they fill one row tile); below 15 rows the AVX-512 decode kernel is as fast.
AMX_Q4_ROWS_MIN = 15


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def quantized_desc(w: QuantizedWeight, bias: torch.Tensor | None = None, bf16_min_rows: int = 0) -> WeightDesc:
    """`qweight_t` of a QuantizedWeight, for `quant_apply`."""
    if bias is not None:
        assert bias.dtype == torch.float32 and bias.is_contiguous() and bias.shape == (w.out_features,)
    assert w.codes.is_contiguous() and w.scales.is_contiguous()
    if w.kind == "q8":
        kind = WeightKind.QW_Q8_PANEL if w.order == "panel" else WeightKind.QW_Q8
    else:
        kind = {"gguf": WeightKind.QW_Q4_GGUF, "x8": WeightKind.QW_Q4_X8, "panel": WeightKind.QW_Q4_PANEL}[w.order]
    if bf16_min_rows:
        assert w.order == "panel", "bfloat16 products are taken by the panel orders' GEMM only"
    return WeightDesc(kind, int(w.scales.dtype == torch.float16), w.group, w.out_features, w.in_features,
                      w.codes.data_ptr(), w.scales.data_ptr(), _ptr(w.mins), _ptr(bias), bf16_min_rows)


def dense_desc(weight: torch.Tensor, bias: torch.Tensor | None = None, panel: bool = False) -> WeightDesc:
    """`qweight_t` of a float32 weight [N, K] (K a multiple of 16): the float kernels of `quant_apply`. With
    `panel` its elements are in the panel order (formats.to_panels); a bfloat16 weight must be in the
    bfloat16 panel order (formats.to_bf16_panels)."""
    n, k = weight.shape
    assert weight.dtype in (torch.float32, torch.bfloat16) and weight.is_contiguous() and k % 16 == 0
    if bias is not None:
        assert bias.dtype == torch.float32 and bias.is_contiguous() and bias.shape == (n,)
    if weight.dtype == torch.bfloat16:
        assert panel, "bfloat16 weights are read in the panel order only"
        return WeightDesc(WeightKind.QW_BF16_PANEL, 0, k, n, k, weight.data_ptr(), None, None, _ptr(bias))
    kind = WeightKind.QW_F32_PANEL if panel else WeightKind.QW_F32
    return WeightDesc(kind, 0, k, n, k, weight.data_ptr(), None, None, _ptr(bias))


class LinearKernels:
    """The linears of a loaded kernels library (tgi_llm.native)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        #: Output rows per panel of the "panel" q4 byte order (formats.py): the CPU's float lanes.
        self.panel_lanes = int(lib.panel_lanes())
        #: The same for q8 codes (twice as wide: one stream of bytes per thread).
        self.q8_panel_lanes = int(lib.q8_panel_lanes())
        #: The most activation rows the q4 panel decode kernel takes in one pass over the codes.
        self.rows_per_pass = int(lib.panel_rows_per_pass())
        #: Whether the panel GEMMs run on AMX tiles from AMX_MIN_ROWS rows: the CPU has AMX-BF16, the kernel
        #: grants the tile state, and TGI_LLM_AMX is not 0 (quant_kernels turns it off if its check fails).
        self.amx = bool(lib.amx_usable()) and settings().amx
        self.set_amx_min_rows(AMX_MIN_ROWS if self.amx else 0)

    def set_amx_min_rows(self, rows: int) -> None:
        """From how many activation rows the panel GEMMs take the tile unit (0: never; bfloat16 weights from
        min(rows, AMX_BF16_MIN_ROWS), q4 decode rows from min(rows, AMX_Q4_ROWS_MIN) to 16); a no-op without
        AMX. Process-wide: the tests force 1 to run small shapes there."""
        self._lib.set_amx_min_rows(rows, min(rows, AMX_BF16_MIN_ROWS), min(rows, AMX_Q4_ROWS_MIN))

    def apply(self, x: torch.Tensor, desc: WeightDesc, gemm_min: int, out: torch.Tensor | None = None
              ) -> torch.Tensor:
        """x [M, K] float32 (rows may be strided) -> x W^T + b [M, N] (into `out` when given): the decode
        kernel of the weight's layout below `gemm_min` rows, its GEMM from there; `quant_apply` picks."""
        if x.stride(-1) != 1:
            x = x.contiguous()
        m = x.shape[0]
        assert x.shape[1] == desc.K and x.dtype == torch.float32
        y = torch.empty(m, desc.N, dtype=torch.float32) if out is None else out
        self._lib.quant_apply(ctypes.byref(desc), x.data_ptr(), x.stride(0), y.data_ptr(), y.stride(0), m, gemm_min,
                              torch.get_num_threads())
        return y

    def linear(self, x: torch.Tensor, w: QuantizedWeight, out: torch.Tensor | None = None) -> torch.Tensor:
        """The decode kernel at any number of rows (x [M, K] float32 -> [M, N] float32)."""
        return self.apply(x, quantized_desc(w), x.shape[0] + 1, out)

    def gemm(self, x: torch.Tensor, w: QuantizedWeight, out: torch.Tensor | None = None) -> torch.Tensor:
        """As `linear`, register-blocked over a dequantized panel: for many activation rows."""
        return self.apply(x, quantized_desc(w), 0, out)


def _self_check(kernels: LinearKernels) -> None:
    """Every layout and scale dtype on small odd shapes against the torch reference: a library that loads
    but computes wrong (a miscompile, a stale cache) must not serve requests."""
    from tgi_llm.quant.formats import quantize_int4, quantize_int8

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(37, 128, generator=gen)
    # 18 rows: q4 panels on AVX-512 in passes of 16 + 2 (the 2-row pass sums in two partials), the other
    # layouts in 12 + 6 (AVX-512) or 6 x 3 (AVX2); x[:1] below: the one-row pass
    x = torch.randn(18, 128, generator=gen)
    q4 = (quantize_int4(w, 32), quantize_int4(w * 1e5, 64))
    wp = torch.randn(3 * kernels.panel_lanes, 128, generator=gen)  # an odd number of panels: pairs and a single one
    panel = [quantize_int4(wp, g).with_order("panel", kernels.panel_lanes) for g in (32, 64)]
    q8_symmetric = replace(quantize_int8(w, 32), mins=None)  # GGUF's Q8_0 / Q6_K: no mins
    w8 = torch.randn(3 * kernels.q8_panel_lanes, 128, generator=gen)
    panel += [q.with_order("panel", kernels.q8_panel_lanes)
              for q in (quantize_int8(w8, 16), quantize_int8(w8, 32), replace(quantize_int8(w8, 32), mins=None))]
    for qw in (*q4, *(q.with_order("x8") for q in q4), *panel, quantize_int8(w, 16), quantize_int8(w, 32),
               q8_symmetric):
        dense = qw.dequantize()
        if not torch.equal(kernels.gemm(torch.eye(qw.in_features), qw), dense.T):  # x = I: y = W^T, exactly
            raise RuntimeError(f"{qw.source} dequantization disagrees with torch")
        for name, fn, rows in (("linear", kernels.linear, x), ("linear", kernels.linear, x[:1]),
                               ("gemm", kernels.gemm, x)):
            if not torch.allclose(fn(rows, qw), rows @ dense.T, rtol=1e-4, atol=1e-3 * dense.abs().max().item()):
                raise RuntimeError(f"{qw.source} {name} of {rows.shape[0]} rows disagrees with torch")
    wf = torch.randn(3 * kernels.q8_panel_lanes, 128, generator=gen)
    wf_panels = to_panels(wf, kernels.q8_panel_lanes)
    for gemm_min in (0, 100):  # float32 weights: the GEMM and the decode kernel, plain and panel order
        if not torch.allclose(kernels.apply(x, dense_desc(w), gemm_min), x @ w.T, rtol=1e-4, atol=1e-4):
            raise RuntimeError(f"float32 {'gemm' if gemm_min == 0 else 'linear'} disagrees with torch")
        if not torch.allclose(kernels.apply(x, dense_desc(wf_panels, panel=True), gemm_min), x @ wf.T, rtol=1e-4,
                              atol=1e-4):
            raise RuntimeError(f"float32 panel {'gemm' if gemm_min == 0 else 'linear'} disagrees with torch")
    wb = to_bf16_panels(wf, kernels.q8_panel_lanes)  # bfloat16 weights: products of bfloat16-rounded operands
    for rows in (1, 11):  # a partial row tile and a whole one and more
        xr = torch.randn(rows, 128, generator=gen)
        want = xr.bfloat16().double() @ wf.bfloat16().double().T
        if not torch.allclose(kernels.apply(xr, dense_desc(wb, panel=True), 0).double(), want, rtol=1e-5, atol=1e-5):
            raise RuntimeError("bfloat16 panel gemm disagrees with torch")
    for qw in (panel[0], panel[3]):  # q4 and q8 codes with bfloat16 products (--dtype bfloat16)
        want = x.bfloat16().double() @ qw.dequantize().bfloat16().double().T
        got = kernels.apply(x, quantized_desc(qw, None, 1), 0).double()
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item()):
            raise RuntimeError(f"{qw.source} gemm with bfloat16 products disagrees with torch")


def _self_check_amx(kernels: LinearKernels) -> None:
    """The same checks with every GEMM on the tile unit; a failure turns AMX off, not the kernels."""
    kernels.set_amx_min_rows(1)
    try:
        _self_check(kernels)
    except Exception as exc:
        kernels.amx = False
        logger.warning("quantized linears: AMX tiles off, their check failed (pid %d): %s", os.getpid(), exc)
    finally:
        kernels.set_amx_min_rows(AMX_MIN_ROWS if kernels.amx else 0)


def _check(kernels: LinearKernels) -> str:
    """Every layout against torch (and again on the tile unit, where a failure turns AMX off, not the kernels)."""
    _self_check(kernels)
    if kernels.amx:
        _self_check_amx(kernels)
    if not kernels.amx:
        return "C kernels"
    return (f"C kernels, AMX tiles from {AMX_MIN_ROWS} rows ({AMX_BF16_MIN_ROWS} for bfloat16 weights, "
            f"{AMX_Q4_ROWS_MIN}-16 for q4 decode rows)")


#: The compiled kernels, or None where they can't be built, load or pass their self-check, or are switched off
#: with TGI_LLM_QUANT_KERNELS=0. Decided once per process and logged once.
quant_kernels = CheckedKernels("quantized linears", "TGI_LLM_QUANT_KERNELS", lambda: settings().quant_kernels,
                               LinearKernels, _check)
