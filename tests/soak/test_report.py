"""The soak's checks: they pass on a consistent run and fail on each kind of inconsistency."""

from __future__ import annotations

from tgi_llm.soak.clients import Result
from tgi_llm.soak.report import build_report, markdown, rss_growth


def snapshot(count=0, success=0, validation=0, cancelled=0, tokens=0, free=64, total=64) -> dict:
    return {
        ("tgi_request_count", frozenset()): count, ("tgi_request_success", frozenset()): success,
        ("tgi_request_failure", frozenset({("err", "validation")})): validation,
        ("tgi_request_failure", frozenset({("err", "cancelled")})): cancelled,
        ("tgi_request_generated_tokens_sum", frozenset()): tokens,
        ("tgi_kv_blocks_free", frozenset()): free, ("tgi_kv_blocks_total", frozenset()): total,
        ("tgi_kv_blocks_used", frozenset()): total - free,
    }


def results() -> list[Result]:
    return [
        Result(0, "grpc", "normal", True, finals=1, ok=True, tokens=5),
        Result(1, "http", "invalid", False, finals=1, error="HTTP 400"),
        Result(2, "openai", "cancel", True, cancelled=True),
    ]


def test_a_consistent_run_passes():
    report = build_report(3, results(), 1.0, snapshot(), snapshot(3, 1, 1, 1, 5), [(1, 100), (2, 101), (3, 101)],
                          check_rss=True)
    assert report.passed, report.checks
    assert "PASSED" in markdown(report)


def test_each_inconsistency_fails_its_check():
    doubled = results()
    doubled[0].finals = 2
    report = build_report(3, doubled, 1.0, snapshot(), snapshot(3, 1, 1, 1, 5), [], check_rss=False)
    assert not report.checks["every request got exactly one final (none after a cancel)"]
    leaked = build_report(3, results(), 1.0, snapshot(), snapshot(3, 1, 1, 1, 5, free=60), [], check_rss=False)
    assert not leaked.checks["KV blocks all free after the run"]
    lost = build_report(3, results(), 1.0, snapshot(), snapshot(3, 1, 1, 0, 5), [], check_rss=False)
    assert not lost.checks["every request the server counted ended once (success + failures)"]
    grew = build_report(3, results(), 1.0, snapshot(), snapshot(3, 1, 1, 1, 5), [(1, 100), (2, 100), (3, 110)],
                        check_rss=True)
    assert not grew.passed


def test_rss_growth_by_halves():
    assert rss_growth([(1, 100), (50, 110), (100, 111)]) == {"first_half": 0.1, "second_half": 1 / 110}
    assert rss_growth([(1, 100)]) == {"first_half": None, "second_half": None}
