"""A linear layer over a weight-only quantized weight: the C decode kernel for a few tokens, the C GEMM
for more.

At decode batch sizes the weights' bytes bound the step and the decode kernel reads each code once per 3
activation rows. From 8 rows it is compute-bound and converts each code again for every 3 rows; the GEMM
kernel converts each code once per call. Weights whose output rows fill whole
panels are held in the kernels' "panel" byte order (formats.py), other q4 weights in "x8" where they can
be, the rest in the file's order.
Without the C kernels the weight is dequantized in torch, in row chunks (correct, slower).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tgi_llm.hugepages import in_huge_pages
from tgi_llm.native.abi import WeightDesc, WeightKind
from tgi_llm.quant.formats import QuantizedWeight
from tgi_llm.quant.kernels import quant_kernels, quantized_desc

#: Activation rows from which the GEMM kernel beats the decode kernel for 4-bit codes (measured crossover): the
#: decode kernel's cost grows with every 3 rows, the GEMM's dequantization is fixed. Panel-order weights
#: on AVX-512 take the decode kernel further, up to its rows per pass (gemm_min_tokens).
GEMM_MIN_TOKENS = 10
#: The same for 8-bit codes, which the decode kernel reads at half the arithmetic per byte.
Q8_GEMM_MIN_TOKENS = 16
#: The same for float32 weights in the plain order (rows that do not fill whole panels), which the decode
#: kernel reads with no conversion and re-reads from L2 for every 4 rows: it beats the GEMM (which copies
#: and transposes a panel per call) up to ~48 rows.
FLOAT_GEMM_MIN_TOKENS = 48
#: `--dtype bfloat16` with quantized weights on the CPU (load_model): rows from which the q4/q8 panel GEMM
#: takes bfloat16 products (each dequantized chunk rounded to bfloat16, as the bfloat16 weights' GEMM reads
#: them; bit for bit its results). Below, the float32 decode kernels read the codes, which is faster there.
BF16_GEMM_MIN_TOKENS = 16


def gemm_min_tokens(desc: WeightDesc) -> int:
    """Rows from which `quant_apply` should take the GEMM for this weight (read at call time, so that
    quant/accuracy.py can send every length through the decode kernels)."""
    if desc.kind == WeightKind.QW_F32:
        return FLOAT_GEMM_MIN_TOKENS
    if desc.kind == WeightKind.QW_F32_PANEL:
        return 0  # the GEMM reads it in place: at one row too it streams faster than a decode kernel
    if desc.kind in (WeightKind.QW_Q8, WeightKind.QW_Q8_PANEL):
        return Q8_GEMM_MIN_TOKENS
    kernels = quant_kernels()
    if desc.kind == WeightKind.QW_Q4_PANEL and kernels is not None:
        # Rows that fit one pass of the panel decode kernel (16 on AVX-512) cost it the GEMM's FMAs without
        # its dequantized panel.
        return max(GEMM_MIN_TOKENS, kernels.rows_per_pass + 1)
    return GEMM_MIN_TOKENS


#: The torch fallback dequantizes at most this many float32 bytes at a time (the LM head alone is 113 MB).
CHUNK_BYTES = 16 << 20


class QuantLinear(nn.Module):
    """y = x W^T (+ b) with W held only as `QuantizedWeight` (no float copy). The weight is a plain
    attribute, not a buffer, so `Module.to(dtype)` leaves its codes and float16 scales alone."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.kernels = quant_kernels()
        if self.kernels is not None:  # the kernels' faster byte orders; same bytes
            lanes = self.kernels.panel_lanes if weight.kind == "q4" else self.kernels.q8_panel_lanes
            if weight.out_features % lanes == 0:
                weight = weight.with_order("panel", lanes)
            elif weight.kind == "q4" and weight.in_features % 64 == 0:
                weight = weight.with_order("x8")
        self.qweight = weight.placed(in_huge_pages)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self._desc: WeightDesc | None = None  # made on first use: after Module.to() has placed the bias
        self.bf16_min_rows = 0  # rows from which the GEMM takes bfloat16 products (0: never)

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes

    def dense_weight(self) -> torch.Tensor:
        return self.qweight.dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.dtype == torch.float32:  # the model's case: no reshapes or casts to dispatch
            return self._linear(x)
        y = self._linear(x.reshape(-1, x.shape[-1]).float())
        return y.to(x.dtype).view(*x.shape[:-1], -1)

    def take_bf16_products(self, min_rows: int) -> None:
        """From `min_rows` rows the panel GEMM rounds weights and activations to bfloat16 (--dtype bfloat16)."""
        self.bf16_min_rows = min_rows
        self._desc = None

    def desc(self) -> WeightDesc:
        """Where the C kernels find this layer's weight and bias (for `quant_apply`)."""
        if self._desc is None:
            self._desc = quantized_desc(self.qweight, None if self.bias is None else self.bias.detach(),
                                       self.bf16_min_rows)
        return self._desc

    def _linear(self, x2: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.apply(x2, self.desc(), gemm_min_tokens(self.desc()))
        n, k = self.qweight.shape
        y = torch.empty(x2.shape[0], n, dtype=torch.float32)
        step = max(1, CHUNK_BYTES // (4 * k))
        for start in range(0, n, step):
            stop = min(start + step, n)
            y[:, start:stop] = F.linear(x2, self.qweight.dequantize(slice(start, stop)))
        if self.bias is not None:
            y += self.bias
        return y
