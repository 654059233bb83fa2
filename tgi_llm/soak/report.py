"""The soak's verdict: per-request final counts, the server's metrics against what was sent, KV blocks
after, and the model process's memory curve."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from tgi_llm.soak.clients import Result
from tgi_llm.soak.observe import Metrics, failures, metric

#: What a refused (invalid) request looks like on each protocol (the /v1 routes answer as OpenAI does: 400).
VALIDATION_ERRORS = {"grpc": "StatusCode.INVALID_ARGUMENT", "http": "HTTP 400", "openai": "HTTP 400"}
#: Second-half RSS growth the issue allows.
MAX_SECOND_HALF_GROWTH = 0.02


@dataclass
class SoakReport:
    planned: int
    sent: int
    seconds: float
    by_protocol: dict[str, dict[str, int]]
    wrong_finals: list[dict[str, Any]]  # requests with other than exactly one final (or a cancelled one with any)
    unexpected: list[dict[str, Any]]  # normal requests that failed, invalid ones not refused as invalid
    server: dict[str, float]  # metric deltas over the run
    kv_blocks: dict[str, float]  # after the run
    rss_curve: list[tuple[int, int]]  # (requests done, model process RSS bytes)
    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed, "rss_growth": rss_growth(self.rss_curve)}


def rss_growth(curve: list[tuple[int, int]]) -> dict[str, float | None]:
    """Relative RSS growth over the first and the second half of the run (by requests done)."""
    if len(curve) < 3:
        return {"first_half": None, "second_half": None}
    total = curve[-1][0]
    mid = min(curve, key=lambda point: abs(point[0] - total / 2))
    first, last = curve[0][1], curve[-1][1]
    return {"first_half": (mid[1] - first) / first, "second_half": (last - mid[1]) / mid[1]}


def build_report(planned: int, results: list[Result], seconds: float, before: Metrics, after: Metrics,
                 rss_curve: list[tuple[int, int]], check_rss: bool) -> SoakReport:
    by_protocol: dict[str, Counter] = {}
    wrong_finals, unexpected = [], []
    for r in results:
        counts = by_protocol.setdefault(r.protocol, Counter())
        counts[r.kind] += 1
        counts["ok"] += r.ok and r.kind == "normal"
        counts["cancelled"] += r.cancelled
        counts["finished first"] += r.ok and r.kind == "cancel"
        counts["refused"] += r.kind == "invalid" and r.error == VALIDATION_ERRORS[r.protocol]
        if (r.finals != 1 and not r.cancelled) or (r.cancelled and r.finals):
            wrong_finals.append(_brief(r))
        if (r.kind == "normal" and not r.ok) or (r.kind == "invalid" and r.error != VALIDATION_ERRORS[r.protocol]) \
                or (r.kind == "cancel" and not r.cancelled and not r.ok):
            unexpected.append(_brief(r))
    delta = {name: metric(after, name) - metric(before, name)
             for name in ("tgi_request_count", "tgi_request_success", "tgi_request_generated_tokens_sum",
                          "tgi_request_generated_tokens_count")}
    failed_after, failed_before = failures(after), failures(before)
    for err in set(failed_after) | set(failed_before):
        delta[f"tgi_request_failure{{err={err}}}"] = failed_after.get(err, 0.0) - failed_before.get(err, 0.0)
    failed = sum(v for k, v in delta.items() if k.startswith("tgi_request_failure"))
    sent = len(results)
    normal_ok = [r for r in results if r.kind == "normal" and r.ok]
    cancels = [r for r in results if r.kind == "cancel"]
    invalid = [r for r in results if r.kind == "invalid"]
    finished_first = sum(1 for r in cancels if r.ok)  # ended before the client's cancel
    kv = {name: metric(after, name) for name in ("tgi_kv_blocks_total", "tgi_kv_blocks_free", "tgi_kv_blocks_used")}
    checks = {
        "every request got exactly one final (none after a cancel)": not wrong_finals,
        "normal requests succeeded, invalid ones were refused as invalid": not unexpected,
        "server counted every request sent": delta["tgi_request_count"] == sent,
        "every request the server counted ended once (success + failures)":
            delta["tgi_request_count"] == delta["tgi_request_success"] + failed,
        "server successes = normal successes + cancels that finished first":
            delta["tgi_request_success"] == len(normal_ok) + finished_first,
        "server validation failures = invalid requests sent":
            delta.get("tgi_request_failure{err=validation}", 0.0) == len(invalid),
        "server cancellations = cancels sent - those that finished first":
            delta.get("tgi_request_failure{err=cancelled}", 0.0) == len(cancels) - finished_first,
        "KV blocks all free after the run": kv["tgi_kv_blocks_total"] > 0
            and kv["tgi_kv_blocks_free"] == kv["tgi_kv_blocks_total"],
    }
    checks["generated tokens: server sum = what the clients were told"] = \
        delta["tgi_request_generated_tokens_sum"] == sum(r.tokens or 0 for r in results if r.ok)
    if check_rss:
        growth = rss_growth(rss_curve)["second_half"]
        checks[f"model process RSS grew < {MAX_SECOND_HALF_GROWTH:.0%} over the second half"] = \
            growth is not None and growth < MAX_SECOND_HALF_GROWTH
    return SoakReport(planned, sent, seconds, {k: dict(v) for k, v in by_protocol.items()}, wrong_finals,
                      unexpected, delta, kv, rss_curve, checks)


def _brief(r: Result) -> dict[str, Any]:
    return {"index": r.index, "protocol": r.protocol, "kind": r.kind, "stream": r.stream, "finals": r.finals,
            "ok": r.ok, "error": r.error, "cancelled": r.cancelled}


def markdown(report: SoakReport) -> str:
    growth = rss_growth(report.rss_curve)
    lines = [
        f"Soak: {report.sent} of {report.planned} requests sent in {report.seconds:.0f} s "
        f"({report.sent / max(report.seconds, 1e-9):.1f} requests/s) -- {'PASSED' if report.passed else 'FAILED'}",
        "",
        "| protocol | normal | succeeded | cancel | cancelled | finished before the cancel | invalid | refused |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    columns = ("normal", "ok", "cancel", "cancelled", "finished first", "invalid", "refused")
    for protocol, c in sorted(report.by_protocol.items()):
        lines.append(f"| {protocol} | " + " | ".join(str(c.get(k, 0)) for k in columns) + " |")
    lines += ["", "Server metrics over the run:", ""]
    lines += [f"- {name}: {value:g}" for name, value in sorted(report.server.items())]
    kv = report.kv_blocks
    lines += ["", f"KV blocks after: {kv['tgi_kv_blocks_free']:g} free of {kv['tgi_kv_blocks_total']:g} "
              f"({kv['tgi_kv_blocks_used']:g} used)", ""]
    if report.rss_curve:
        mib = [f"{done}: {rss / 2**20:.0f}" for done, rss in report.rss_curve]
        lines += ["Model process RSS (MiB) by requests done: " + ", ".join(mib)]
        if growth["second_half"] is not None:
            lines += [f"RSS growth: first half {growth['first_half']:+.2%}, second half {growth['second_half']:+.2%}"]
        lines.append("")
    lines += [f"- [{'x' if ok else ' '}] {name}" for name, ok in report.checks.items()]
    for title, items in (("Wrong final counts", report.wrong_finals), ("Unexpected outcomes", report.unexpected)):
        if items:
            lines += ["", f"{title} ({len(items)}), first 10:"] + [f"- {item}" for item in items[:10]]
    return "\n".join(lines)
