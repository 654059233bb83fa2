"""The resident adapters' weights: for each linear an adapter may change, its A and B in `max_loras` fixed
slots, allocated once at start-up (so the C layer stack holds their addresses for good; loading an adapter
writes its slot in place), and the step's rows grouped by slot.

The product runs after the base linear ran once for every row: for each slot with rows in the step,
y[rows] += (x[rows] A^T) B^T per part. The C layer stack does the same in lora.c; this torch version is the
fallback (GPUs, transformers-free layers off the fused stack) and the reference the stack is checked against.
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass, field
from functools import cached_property

import torch

from tgi_llm.lora.peft_adapter import AdapterPart, read_adapter
from tgi_llm.lora.targets import LayerTargets, native_targets
from tgi_llm.native.abi import Lora
from tgi_llm.weights.safetensors_loader import NO_SHARD, Shard


@dataclass
class LoraBatch:
    """Each row's adapter slot for one forward (-1: the base model)."""

    rows: torch.Tensor  # int32 [T], on the CPU (the C kernels read it)
    slots: list[int]  # the slots with rows in this step

    @classmethod
    def of(cls, row_slots: list[int]) -> LoraBatch | None:
        slots = sorted(set(row_slots) - {-1})
        if not slots:
            return None
        return cls(torch.tensor(row_slots, dtype=torch.int32), slots)

    @cached_property
    def groups(self) -> list[tuple[int, torch.Tensor]]:
        """(slot, its row indices) for the torch product."""
        return [(s, torch.nonzero(self.rows == s).flatten()) for s in self.slots]

    def on(self, device: torch.device) -> list[tuple[int, torch.Tensor]]:
        return [(s, rows.to(device)) for s, rows in self.groups]


class LinearLora:
    """One linear's adapters in every slot: A [slots, parts, R, K]; B transposed and scaled, part p's [R, n_p]
    at columns R * offsets[p] of bt [slots, R * N]; ranks [slots, parts] (0: that slot leaves the part alone)."""

    def __init__(self, slots: int, widths: tuple[int, ...], max_rank: int, in_features: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.max_rank, self.in_features = max_rank, in_features
        self.widths = widths
        self.offsets = torch.tensor([0, *itertools.accumulate(widths)], dtype=torch.int64)
        self.out_features = int(self.offsets[-1])
        self.a = torch.zeros((slots, len(widths), max_rank, in_features), dtype=dtype, device=device)
        self.bt = torch.zeros((slots, max_rank * self.out_features), dtype=dtype, device=device)
        self.ranks = torch.zeros((slots, len(widths)), dtype=torch.int32)
        self._ranks = [[0] * len(widths) for _ in range(slots)]  # the same, read by the torch product

    def _bt(self, slot: int, part: int) -> torch.Tensor:
        first, n = int(self.offsets[part]), self.widths[part]
        return self.bt[slot, self.max_rank * first: self.max_rank * (first + n)].view(self.max_rank, n)

    def clear(self, slot: int) -> None:
        self.a[slot].zero_()
        self.bt[slot].zero_()
        self.ranks[slot] = 0
        self._ranks[slot] = [0] * len(self.widths)

    def set(self, slot: int, part: AdapterPart) -> None:
        r = part.rank
        self.a[slot, part.part, :r] = part.a.to(self.a.dtype)
        self._bt(slot, part.part)[:r] = part.b.t().to(self.bt.dtype)
        self.ranks[slot, part.part] = r
        self._ranks[slot][part.part] = r

    def add(self, x: torch.Tensor, y: torch.Tensor, batch: LoraBatch) -> None:
        """y += each row's adapter product (x [T, K], y [T, N] of every row of the step)."""
        for slot, rows in batch.on(x.device):
            xs = x.index_select(0, rows)
            for p, r in enumerate(self._ranks[slot]):
                if not r:
                    continue
                first, n = int(self.offsets[p]), self.widths[p]
                t = xs @ self.a[slot, p, :r].to(xs.dtype).t()
                y[:, first:first + n].index_add_(0, rows, (t @ self._bt(slot, p)[:r].to(xs.dtype)).to(y.dtype))

    @cached_property
    def struct(self) -> Lora:
        """The `lora_t` the C kernels read (its tensors live as long as this object)."""
        return Lora(parts=len(self.widths), rank=self.max_rank, K=self.in_features, N=self.out_features,
                    offsets=self.offsets.data_ptr(), ranks=self.ranks.data_ptr(), a=self.a.data_ptr(),
                    bt=self.bt.data_ptr())

    def address(self) -> int:
        return ctypes.addressof(self.struct)

    @property
    def nbytes(self) -> int:
        return self.a.nbytes + self.bt.nbytes


@dataclass
class ModelLora:
    """Every layer's LinearLoras (by DecoderLayer attribute), `slots` adapters resident at once."""

    config: object
    slots: int
    max_rank: int
    shard: Shard = NO_SHARD
    #: What each layer's modules reach (None: a native family's layers).
    targets: LayerTargets | None = None
    layers: list[dict[str, LinearLora]] = field(default_factory=list)

    @classmethod
    def allocate(cls, config, slots: int, max_rank: int, device: torch.device, dtype: torch.dtype,
                 shard: Shard = NO_SHARD, targets: LayerTargets | None = None) -> ModelLora:
        n = shard.world_size
        out = cls(config, slots, max_rank, shard, targets)
        for index in range(config.num_hidden_layers):
            linears = {}
            for target in {t.linear: t for t in (targets or native_targets(config))(index).values()}.values():
                column = target.split == "column"
                widths = tuple(w // n for w in target.widths) if column else target.widths
                linears[target.linear] = LinearLora(slots, widths, max_rank,
                                                    target.in_features if column else target.in_features // n,
                                                    device, dtype)
            out.layers.append(linears)
        return out

    def read(self, path: str) -> list[AdapterPart]:
        """The adapter at `path` as this shard would hold it (AdapterError when it cannot run here)."""
        return read_adapter(path, self.config, self.max_rank, self.shard, self.targets)

    def load(self, slot: int, path: str) -> None:
        """Put the adapter at `path` in `slot`, replacing what was there."""
        parts = self.read(path)
        for linears in self.layers:
            for linear in linears.values():
                linear.clear(slot)
        for part in parts:
            self.layers[part.layer][part.linear].set(slot, part)

    @property
    def nbytes(self) -> int:
        return sum(linear.nbytes for linears in self.layers for linear in linears.values())
