"""Everything one benchmark invocation measured, in one object that the report renders."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tgi_llm.bench.floor import FloorPoint
from tgi_llm.bench.stats import RunSummary
from tgi_llm.bench.steps import StepGroup

#: System names, as they appear in the JSON and the tables.
TRITON_GRPC, TRITON_HTTP, ENGINE = "triton-grpc", "triton-http", "engine"
STATIC, SERIAL = "transformers-static", "transformers-one-at-a-time"


@dataclass
class SystemRun:
    summary: RunSummary
    engine_steps: list[StepGroup] | None = None  # the in-process engine's steps during this run
    server_steps: dict[str, dict[str, float]] | None = None  # the server's forward totals during this run
    batch_size: int | None = None  # static baselines
    ttft_by_request: dict[int, float] | None = None  # request index -> TTFT s, for paired comparisons
    server_counters: dict[str, float] | None = None  # what the server's counters gained during this run

    def to_dict(self) -> dict:
        return {
            **self.summary.to_dict(),
            "batch_size": self.batch_size,
            "engine_steps": [g.to_dict() for g in self.engine_steps] if self.engine_steps is not None else None,
            "server_steps": self.server_steps,
            "ttft_by_request_s": self.ttft_by_request,
            "server_counters": self.server_counters,
        }


@dataclass(frozen=True)
class Comparison:
    """A ratio (or difference) of two numbers measured in this run, and the goal it is held to."""

    name: str
    value: float | None  # None: could not be measured in this run (see note)
    unit: str  # "x" for ratios, "ms" for differences
    goal: str  # e.g. ">= 3.0"; "" for figures reported without a goal
    met: bool | None
    numerator: str
    denominator: str
    note: str = ""


@dataclass
class BenchResults:
    meta: dict[str, Any]
    workload: dict[str, Any]
    main_concurrency: int
    runs: list[SystemRun] = field(default_factory=list)
    floor: list[FloorPoint] = field(default_factory=list)
    floor_error: str | None = None
    comparisons: list[Comparison] = field(default_factory=list)

    def find(self, system: str, concurrency: int | None = None, rate: float | None = None) -> SystemRun | None:
        for run in self.runs:
            s = run.summary
            if s.system == system and (concurrency is None or s.concurrency == concurrency) \
                    and s.request_rate == rate:
                return run
        return None

    def floor_at(self, batch_size: int) -> FloorPoint | None:
        return next((p for p in self.floor if p.batch_size == batch_size), None)

    def to_dict(self) -> dict:
        return {
            "meta": self.meta,
            "workload": self.workload,
            "main_concurrency": self.main_concurrency,
            "runs": [r.to_dict() for r in self.runs],
            "floor": [p.to_dict() for p in self.floor],
            "floor_error": self.floor_error,
            "comparisons": [c.__dict__ for c in self.comparisons],
        }
