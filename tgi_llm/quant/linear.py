"""A linear layer over a weight-only quantized weight: the C kernel for a few tokens, a dequantized GEMM for many.

At decode batch sizes the weights' bytes bound the step and the kernel reads 4-8 bits per weight. A
prefill of hundreds of tokens is compute-bound: there the weight is dequantized (exactly, in row chunks,
a few hundred microseconds a layer) and multiplied by the float GEMM, whose arithmetic the kernel cannot
beat. Without the C kernels both paths dequantize in torch (correct, slower).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tgi_llm.quant.formats import QuantizedWeight
from tgi_llm.quant.kernels import quant_kernels

#: Tokens from which a dequantized GEMM beats the kernel (docs/PERFORMANCE.md: the crossover on Zen 3 / Zen 5).
GEMM_MIN_TOKENS = 48
#: Dequantize at most this many float32 bytes at a time (the LM head alone is 113 MB dequantized).
CHUNK_BYTES = 16 << 20


def _gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T through oneDNN where torch has it: on a plain (not reordered) weight it matches MKL's sgemm
    on AVX2 (15.3 vs 16.6 ms, 256 x 576 x 3072, one Zen 3 thread) and, unlike MKL on AMD CPUs, runs
    AVX-512 code where the CPU has it."""
    if _ONEDNN:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, None, "none", [], "")
    return F.linear(x, w)


_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class QuantLinear(nn.Module):
    """y = x W^T (+ b) with W held only as `QuantizedWeight` (no float copy). The weight is a plain
    attribute, not a buffer, so `Module.to(dtype)` leaves its codes and float16 scales alone."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.kernels = quant_kernels()
        if self.kernels is not None and weight.kind == "q4" and weight.in_features % 64 == 0:
            weight = weight.with_order("x8")  # the kernel's faster byte order (formats.py); same bytes
        self.qweight = weight.contiguous()
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes

    def dense_weight(self) -> torch.Tensor:
        return self.qweight.dequantize()

    def _dequantized(self, start: int, stop: int) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.dequantize(self.qweight, start, stop)
        return self.qweight.dequantize(slice(start, stop))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.dtype == torch.float32:  # the model's case: no reshapes or casts to dispatch
            return self._linear(x)
        y = self._linear(x.reshape(-1, x.shape[-1]).float())
        return y.to(x.dtype).view(*x.shape[:-1], -1)

    def _linear(self, x2: torch.Tensor) -> torch.Tensor:
        n, k = self.qweight.shape
        if self.kernels is not None and x2.shape[0] < GEMM_MIN_TOKENS:
            y = self.kernels.linear(x2, self.qweight)
        elif n * k * 4 <= CHUNK_BYTES:
            y = _gemm(x2, self._dequantized(0, n))
        else:
            y = torch.empty(x2.shape[0], n, dtype=torch.float32)
            step = max(1, CHUNK_BYTES // (4 * k))
            for start in range(0, n, step):
                y[:, start:start + step] = _gemm(x2, self._dequantized(start, min(start + step, n)))
        if self.bias is not None:
            y += self.bias
        return y
