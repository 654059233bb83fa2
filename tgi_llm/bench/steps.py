"""The engine's per-step timings (`engine.drain_step_stats()`), grouped by method and batch size.

A decode step's time is forward + bookkeeping (scheduling and postprocessing on the engine thread);
the bookkeeping share is summed over steps, so long steps weigh what they cost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from tgi_llm.bench.stats import percentile


@dataclass(frozen=True)
class StepGroup:
    method: str
    batch_size: int
    steps: int
    forward_p50_s: float
    bookkeeping_p50_s: float
    step_p50_s: float  # forward + bookkeeping, per step
    bookkeeping_share: float  # sum(bookkeeping) / sum(forward + bookkeeping)
    forward_sum_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def group_steps(steps: Iterable[Any]) -> list[StepGroup]:
    """`steps`: objects with method, batch_size, forward_s, bookkeeping_s (engine StepStats)."""
    groups: dict[tuple[str, int], list[Any]] = {}
    for s in steps:
        groups.setdefault((s.method, s.batch_size), []).append(s)
    out = []
    for (method, batch), items in sorted(groups.items()):
        fwd = [s.forward_s for s in items]
        bk = [s.bookkeeping_s for s in items]
        total = sum(fwd) + sum(bk)
        step = [f + b for f, b in zip(fwd, bk, strict=True)]
        out.append(StepGroup(
            method=method, batch_size=batch, steps=len(items), forward_p50_s=percentile(fwd, 50),
            bookkeeping_p50_s=percentile(bk, 50), step_p50_s=percentile(step, 50),
            bookkeeping_share=sum(bk) / total if total > 0 else 0.0, forward_sum_s=sum(fwd),
        ))
    return out


def forward_totals(groups: Iterable[StepGroup]) -> dict[str, dict[str, float]]:
    """Per method: steps, forward seconds and mean, in the shape server_metrics reports the server's."""
    out: dict[str, dict[str, float]] = {}
    for g in groups:
        t = out.setdefault(g.method, {"steps": 0.0, "forward_s": 0.0})
        t["steps"] += g.steps
        t["forward_s"] += g.forward_sum_s
    for t in out.values():
        t["forward_mean_s"] = t["forward_s"] / t["steps"]
    return out


def find(groups: Iterable[StepGroup], method: str, batch_size: int) -> StepGroup | None:
    return next((g for g in groups if g.method == method and g.batch_size == batch_size), None)


class StepCollector:
    """Drains the engine's step stats every `interval_s` while a run goes on: the engine keeps only its
    last 4096 steps, fewer than a long run at low concurrency takes."""

    def __init__(self, drain: Callable[[], list[Any]], interval_s: float = 0.5) -> None:
        self._drain, self._interval_s = drain, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-steps", daemon=True)
        self.steps: list[Any] = []

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.steps.extend(self._drain())

    def __enter__(self) -> StepCollector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.steps.extend(self._drain())
