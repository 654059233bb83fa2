"""The server's own per-step forward times, from its Prometheus histogram `tgi_batch_forward_duration`
(sum and count per method), read before and after a run: the server engine's steps are in another
process, so this is how a run through Triton shows whether the forward itself got slower."""

from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass

#: vLLM's speculative-decoding counters, as the server exports them: verify steps, guessed and accepted tokens.
SPECULATION_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                        "vllm:spec_decode_num_accepted_tokens")

_LINE = re.compile(r'^tgi_batch_forward_duration_(sum|count)\{[^}]*method="(\w+)"[^}]*\} (\S+)$')


@dataclass(frozen=True)
class ForwardTotals:
    """method -> (steps, seconds of forward)."""

    by_method: dict[str, tuple[float, float]]

    def minus(self, before: ForwardTotals) -> dict[str, dict[str, float]]:
        out = {}
        for method, (count, total) in self.by_method.items():
            c0, t0 = before.by_method.get(method, (0.0, 0.0))
            steps, seconds = count - c0, total - t0
            if steps > 0:
                out[method] = {"steps": steps, "forward_s": seconds, "forward_mean_s": seconds / steps}
        return out


def parse_forward_totals(text: str) -> ForwardTotals:
    values: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            values.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
    return ForwardTotals({k: (v.get("count", 0.0), v.get("sum", 0.0)) for k, v in values.items()})


def read_counters(metrics_url: str, names: tuple[str, ...]) -> dict[str, float] | None:
    """Unlabelled counters or gauges by name (missing ones read 0); None when the endpoint cannot be read."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    values = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = float(value)
    return values


def read_forward_totals(metrics_url: str) -> ForwardTotals | None:
    """None when the metrics endpoint cannot be read (the benchmark then reports no server steps)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as r:
            return parse_forward_totals(r.read().decode())
    except OSError:
        return None


def speculation_counters(scheduler: object) -> dict[str, float]:
    """The in-process engine's speculation counters under the names the server exports them by."""
    values = (scheduler.num_drafts, scheduler.num_draft_tokens, scheduler.num_accepted_tokens)
    return dict(zip(SPECULATION_COUNTERS, map(float, values), strict=True))


def acceptance(counters: dict[str, float] | None) -> tuple[float, float] | None:
    """(draft tokens verified, the fraction of them accepted) from counters gained in a run; None when the
    run guessed nothing or the counters could not be read."""
    drafted = (counters or {}).get(SPECULATION_COUNTERS[1], 0.0)
    if drafted <= 0:
        return None
    return drafted, counters.get(SPECULATION_COUNTERS[2], 0.0) / drafted
