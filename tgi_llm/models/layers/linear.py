"""Float linear layers on the CPU and elsewhere: the C kernels (in their panel order), oneDNN's packed
weights, or F.linear. Quantized weights are QuantLinear (quant/linear.py); WeightLoader picks per weight."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from tgi_llm.hugepages import in_huge_pages
from tgi_llm.native.abi import WeightDesc
from tgi_llm.quant.formats import from_bf16_panels, from_panels, to_bf16_panels, to_panels
from tgi_llm.quant.kernels import LinearKernels, dense_desc, quant_kernels
from tgi_llm.quant.linear import gemm_min_tokens
from tgi_llm.settings import settings

logger = logging.getLogger(__name__)

#: Batch-size hint for oneDNN's weight layout; the packed weight serves any batch size.
_PACK_BATCH_HINT = 32


def pack_weight_for_cpu(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` [N, K] reordered into oneDNN's blocked layout, or None where that is not possible.

    On CPU, fp32 F.linear goes to MKL sgemm, which runs no AVX-512 code on AMD CPUs; oneDNN's packed
    linear does and is ~2.3x faster at both decode and prefill batch shapes (docs/PERFORMANCE.md)."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_BATCH_HINT)
    except (RuntimeError, AttributeError) as exc:  # a torch built without these ops
        logger.warning("oneDNN weight packing unavailable (%s); using F.linear", exc)
        return None


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def float_linear_kernels(dtype: torch.dtype) -> LinearKernels | None:
    """The C kernels for float32 linears, or None for oneDNN's packed ones. Weights whose rows fill whole
    panels are held in the panel order, which the C GEMM reads in place: at or ahead of oneDNN at every row
    count on AVX-512, and faster at decode's few rows without it. They also let the fused decode stack take
    float models. TGI_LLM_FLOAT_LINEARS=onednn keeps oneDNN."""
    if dtype != torch.float32 or settings().float_linears == "onednn":
        return None
    return quant_kernels()


def whole_panels(rows: int, lanes: int) -> int:
    """`lanes` where `rows` fill whole panels of that width (the panel order), else 0 (row-major)."""
    return lanes if rows % lanes == 0 else 0


class Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.packed: torch.Tensor | None = None
        self.kernels: LinearKernels | None = None
        #: Output rows per panel when `weight` holds its elements in the kernels' panel order (0: row-major).
        self.panel_lanes = 0
        self._desc: WeightDesc | None = None

    def fits_kernels(self) -> bool:
        """Whether the C float32 kernels (quant_apply) can take this weight."""
        w = self.weight
        return w.dtype == torch.float32 and w.device.type == "cpu" and w.shape[1] % 16 == 0

    def use_kernels(self, kernels: LinearKernels, weight_dtype: torch.dtype = torch.float32) -> None:
        """Run through the C float32 kernels (after `fits_kernels`), in the panel order (rearranged in
        place: the GEMM reads it as it is) where the rows fill whole panels. With `weight_dtype` bfloat16
        such a weight is held rounded to bfloat16, in the bfloat16 panel order (quant/kernels.py)."""
        self.panel_lanes = whole_panels(self.weight.shape[0], kernels.q8_panel_lanes)
        if weight_dtype == torch.bfloat16 and self.panel_lanes:
            self.weight.data = to_bf16_panels(self.weight.detach(), self.panel_lanes, in_huge_pages)
        else:
            self.weight.data = to_panels(self.weight.detach(), self.panel_lanes, in_huge_pages)
        self.kernels = kernels

    def desc(self) -> WeightDesc:
        """Where the C kernels find this layer's weight and bias (after `use_kernels`)."""
        if self._desc is None:
            self._desc = dense_desc(self.weight.detach(), None if self.bias is None else self.bias.detach(),
                                    panel=self.panel_lanes > 0)
        return self._desc

    def pack(self) -> bool:
        """Swap the weight for its oneDNN-packed form (dropping the plain copy: no doubled memory)."""
        packed = pack_weight_for_cpu(self.weight)
        if packed is None:
            return False
        self.packed = packed
        del self.weight
        return True

    def dense_weight(self) -> torch.Tensor:
        if self.packed is not None:
            return self.packed.to_dense()
        if self.weight.dtype == torch.bfloat16 and self.kernels is not None:
            return from_bf16_panels(self.weight, self.panel_lanes)
        return from_panels(self.weight, self.panel_lanes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_linear(x, self.packed, self.bias)
        if self.kernels is not None and x.dim() == 2 and x.dtype == torch.float32:
            return self.kernels.apply(x, self.desc(), gemm_min_tokens(self.desc()))
        return F.linear(x, self.dense_weight(), self.bias)
