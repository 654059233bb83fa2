"""Per-request timing records and what a run reports from them.

Every client (gRPC, HTTP, in-process engine, transformers) fills the same `RequestRecord`: when the
request was sent, when each token arrived, when it ended. Tokens are counted from the stream (one
timestamp per token-carrying response); what the server says it generated is kept next to it so a
mismatch shows. Definitions follow vLLM's benchmark client: TTFT = first token - send; ITL = gaps
between consecutive tokens, pooled over all requests; TPOT = (e2e - TTFT) / (tokens - 1) per request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field


@dataclass
class RequestRecord:
    index: int
    input_len: int
    expected_output_len: int
    start: float = 0.0  # perf_counter seconds when sent
    token_times: list[float] = field(default_factory=list)  # arrival of each token
    end: float | None = None  # final response received
    reported_output_tokens: int | None = None  # what the server says it generated
    reported_input_tokens: int | None = None
    error: str | None = None
    text: str = ""  # the streamed text (a multi-turn conversation builds its next prompt from it)

    @property
    def ok(self) -> bool:
        return self.end is not None and self.error is None

    @property
    def output_tokens(self) -> int:
        return len(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def e2e(self) -> float | None:
        return self.end - self.start if self.end is not None else None

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2 or self.end is None:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (self.output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        v = list(values)
        if not v:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(len(v), sum(v) / len(v), percentile(v, 50), percentile(v, 90), percentile(v, 99), max(v))


@dataclass(frozen=True)
class RunSummary:
    """What one run of one system reports. Throughputs count completed requests only."""

    system: str
    concurrency: int | None  # None: unbounded (offline batch, or Poisson without a cap)
    request_rate: float | None  # requests/s of a Poisson arrival process; None: all at once
    num_requests: int
    completed: int
    failed: int
    wall_s: float
    input_tokens: int
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_s: Distribution
    itl_s: Distribution
    tpot_s: Distribution
    e2e_s: Distribution
    #: completed requests whose streamed token count differs from what the server reported
    token_count_mismatches: int
    #: completed requests that did not generate exactly the asked output length
    length_mismatches: int
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(system: str, records: Sequence[RequestRecord], wall_s: float, concurrency: int | None = None,
              request_rate: float | None = None, max_errors: int = 5) -> RunSummary:
    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    return RunSummary(
        system=system,
        concurrency=concurrency,
        request_rate=request_rate,
        num_requests=len(records),
        completed=len(done),
        failed=len(failed),
        wall_s=wall_s,
        input_tokens=sum(r.input_len for r in done),
        output_tokens=output_tokens,
        output_tokens_per_s=output_tokens / wall_s if wall_s > 0 else math.nan,
        requests_per_s=len(done) / wall_s if wall_s > 0 else math.nan,
        ttft_s=Distribution.of(r.ttft for r in done if r.ttft is not None),
        itl_s=Distribution.of(gap for r in done for gap in r.itls),
        tpot_s=Distribution.of(r.tpot for r in done if r.tpot is not None),
        e2e_s=Distribution.of(r.e2e for r in done if r.e2e is not None),
        token_count_mismatches=sum(
            1 for r in done if r.reported_output_tokens is not None and r.reported_output_tokens != r.output_tokens
        ),
        length_mismatches=sum(1 for r in done if r.output_tokens != r.expected_output_len),
        errors=[f"request {r.index}: {r.error or 'did not finish'}" for r in failed[:max_errors]],
    )


def wall_time(records: Sequence[RequestRecord]) -> float:
    """First send to last end, over the records that ended."""
    ended = [r for r in records if r.end is not None]
    if not ended:
        return 0.0
    return max(r.end for r in ended) - min(r.start for r in ended)
