"""Snapshots the engine exposes for metrics and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    queue_size: int
    batch_size: int
    batch_max_tokens: int
    kv_blocks_total: int
    kv_blocks_free: int
    running: int  # requests between submit and their final event

    @property
    def kv_blocks_used(self) -> int:
        return self.kv_blocks_total - self.kv_blocks_free


@dataclass(frozen=True)
class StepStats:
    method: str  # "prefill" when the step admitted sequences, else "decode" (TGI's metric label)
    batch_size: int
    num_tokens: int
    num_prefill: int
    forward_s: float
    bookkeeping_s: float  # scheduling + postprocessing on the engine thread
