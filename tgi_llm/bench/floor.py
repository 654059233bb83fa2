"""The matmul floor of a decode step: the model's matrix multiplications alone, at the decode batch shapes.

A decode step of B sequences multiplies a [B, in] activation by every linear weight of every layer (fused
qkv, o, fused gate/up, down) and then by the LM head. `MatmulFloor` runs exactly those products through the
model's own `Linear` modules (so the same kernels and weight layout as the real step) on random
activations, and nothing else: no norms, rope, attention, sampling or Python between layers. A step can't
be faster than this. `tools/matmul_floor.py` is its CLI; `tools/bench_decode_floor.py` and `tgi-llm-bench`
report real steps as multiples of it, measured in the same run.

On a shared machine the load changes from minute to minute, so `FloorMeter` samples the floor right before
and right after the engine run whose decode steps it is compared with, and keeps both halves: a large
difference between them says the ratio is not to be trusted.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from tgi_llm.models.decoder import CausalLM
from tgi_llm.models.layers.linear import Linear, packed_linear
from tgi_llm.quant.linear import QuantLinear


def _bytes_read(lin: torch.nn.Module | None, dense: torch.Tensor, plain: bool) -> int:
    """What one call streams: the quantized codes and scales, or the float weight."""
    if isinstance(lin, QuantLinear) and not plain:
        return lin.nbytes
    return dense.numel() * dense.element_size()


class MatmulFloor:
    """The linears of one decode step of `batch` sequences, in the model's layer order."""

    def __init__(self, model: CausalLM, batch: int, plain: bool = False) -> None:
        if model.config.moe is not None:
            raise ValueError(f"the matmul floor measures dense models; {model.config.family} routes its MLPs to "
                             "experts")
        self.model, self.batch = model, batch
        dtype = model.dtype
        linears = [m for layer in model.layers for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
        self.calls: list[Callable[[], torch.Tensor]] = []
        self.flops = self.weight_bytes = 0
        for lin in linears:
            weight = lin.dense_weight()
            x = torch.randn(batch, weight.shape[1], dtype=dtype)
            self.calls.append(self._call(lin, weight, x, plain))
            self.flops += 2 * batch * weight.numel()
            self.weight_bytes += _bytes_read(lin, weight, plain)
        quant_head = model.lm_head_quant
        head = model.lm_head if quant_head is None else quant_head.dense_weight()
        head = head.to(dtype)  # a bfloat16 head (--dtype bfloat16 on the CPU) for F.linear of float32 rows
        x = torch.randn(batch, head.shape[1], dtype=dtype)
        if quant_head is not None and not plain:
            self.calls.append(lambda x=x: quant_head(x))
        elif model.lm_head_packed is not None and not plain:
            self.calls.append(lambda x=x: packed_linear(x, model.lm_head_packed, None))
        else:
            self.calls.append(lambda x=x: F.linear(x, head))
        self.flops += 2 * batch * head.numel()
        self.weight_bytes += _bytes_read(quant_head, head, plain)

    @staticmethod
    def _call(lin: Linear, weight: torch.Tensor, x: torch.Tensor, plain: bool) -> Callable[[], torch.Tensor]:
        if plain:  # keep the dense copy alive for the plain variant only
            return lambda: F.linear(x, weight, lin.bias)
        return lambda: lin(x)

    @torch.inference_mode()
    def run(self) -> float:
        t0 = time.perf_counter()
        for call in self.calls:
            call()
        return time.perf_counter() - t0

    def median(self, reps: int) -> float:
        self.run()
        return statistics.median(self.run() for _ in range(reps))


@dataclass(frozen=True)
class FloorPoint:
    batch_size: int
    median_s: float  # over every sample
    min_s: float
    gflops_per_s: float
    weight_gb_per_s: float
    median_by_phase_s: dict[str, float] = field(default_factory=dict)  # e.g. before / after the engine run

    def to_dict(self) -> dict:
        return asdict(self)


class FloorMeter:
    """Samples one decode step's matmuls per batch size; batch sizes are measured round-robin, so a burst
    of load on the machine spreads over all of them rather than landing on one."""

    def __init__(self, model: Any, batch_sizes: list[int]) -> None:
        self._floors = {b: MatmulFloor(model, b) for b in sorted(set(batch_sizes))}
        self._samples: dict[int, list[tuple[str, float]]] = {b: [] for b in self._floors}
        for floor in self._floors.values():
            floor.run()  # warm-up: first calls pick kernels and allocate

    def sample(self, reps: int, phase: str = "") -> None:
        for _ in range(reps):
            for b, floor in self._floors.items():
                self._samples[b].append((phase, floor.run()))

    def points(self) -> list[FloorPoint]:
        out = []
        for b, floor in self._floors.items():
            times = [t for _, t in self._samples[b]]
            if not times:
                continue
            median = statistics.median(times)
            phases = {p: statistics.median(t for q, t in self._samples[b] if q == p) for p, _ in self._samples[b]}
            out.append(FloorPoint(b, median, min(times), floor.flops / median / 1e9, floor.weight_bytes / median / 1e9,
                                  phases))
        return out
