"""Comparisons and the report, from synthetic results: the ratios, the goals, and the three files."""

from __future__ import annotations

import json

import pytest

from tgi_llm.bench.floor import FloorPoint
from tgi_llm.bench.report import write_report
from tgi_llm.bench.results import ENGINE, SERIAL, STATIC, TRITON_GRPC, BenchResults, SystemRun
from tgi_llm.bench.server_metrics import SPECULATION_COUNTERS
from tgi_llm.bench.stats import RequestRecord, summarize
from tgi_llm.bench.steps import StepGroup
from tgi_llm.bench.targets import compare


def run(system, concurrency, tokens_per_s, ttft_s=0.05, batch_size=None, steps=None):
    """A run of 4 requests of 10 tokens whose throughput is `tokens_per_s`."""
    wall = 40 / tokens_per_s
    records = [RequestRecord(i, 8, 10, start=0.0, token_times=[ttft_s + k * 0.01 for k in range(10)],
                             end=wall, reported_output_tokens=10) for i in range(4)]
    return SystemRun(summarize(system, records, wall, concurrency), engine_steps=steps, batch_size=batch_size,
                     ttft_by_request={r.index: r.ttft for r in records})


def decode32(step_s, bookkeeping_share):
    forward = step_s * (1 - bookkeeping_share)
    return [StepGroup("decode", 32, 100, forward, step_s * bookkeeping_share, step_s, bookkeeping_share, 100 * forward)]


@pytest.fixture
def results():
    r = BenchResults(meta={"date": "2026-01-01", "model": "m", "request_rate": None},
                     workload={"kind": "mixed", "num_requests": 4, "input_len": [8, 8], "output_len": [10, 10],
                               "seed": 0, "ignore_eos": True, "input_mean": 8, "output_mean": 10},
                     main_concurrency=32)
    r.runs = [run(TRITON_GRPC, 1, 50.0, ttft_s=0.0135), run(ENGINE, 1, 52.0, ttft_s=0.010),
              run(TRITON_GRPC, 32, 300.0), run(ENGINE, 32, 320.0, steps=decode32(0.065, 0.04)),
              run(STATIC, None, 100.0, batch_size=16), run(SERIAL, None, 25.0, batch_size=1)]
    r.floor = [FloorPoint(32, 0.05, 0.049, 1.0, 1.0, {"before": 0.049, "after": 0.051})]
    return r


def by_name(comparisons, start):
    return next(c for c in comparisons if c.name.startswith(start))


def test_comparisons_are_ratios_of_this_runs_numbers(results):
    cs = compare(results, TRITON_GRPC, 16)
    static = by_name(cs, "triton-grpc / transformers static")
    assert static.value == pytest.approx(3.0) and static.met is True
    engine = by_name(cs, "triton-grpc / engine in-process")
    assert engine.value == pytest.approx(300 / 320) and engine.met is False  # 0.9375 < 0.95
    ttft = by_name(cs, "TTFT p50 at concurrency 1")
    assert ttft.value == pytest.approx(3.5) and ttft.unit == "ms" and ttft.met is True
    floor = by_name(cs, "decode step at batch 32")
    assert floor.value == pytest.approx(1.3) and floor.met is True
    paired = by_name(cs, "TTFT at concurrency 1, median of per-request")
    assert paired.value == pytest.approx(3.5) and paired.met is None
    share = by_name(cs, "bookkeeping")
    assert share.value == pytest.approx(0.04) and share.met is True
    serial = by_name(cs, "triton-grpc / one request at a time")
    assert serial.value == pytest.approx(12.0) and serial.met is None and serial.goal == ""


def test_what_was_not_measured_is_reported_as_such(results):
    results.runs = [r for r in results.runs if r.summary.concurrency != 1 and r.summary.system != STATIC]
    results.floor, results.floor_error = [], "the engine runs sharded"
    cs = compare(results, TRITON_GRPC, 16)
    for start in ("triton-grpc / transformers static", "TTFT p50", "decode step at batch 32"):
        c = by_name(cs, start)
        assert c.value is None and c.met is None and c.note
    assert "sharded" in by_name(cs, "decode step").note


def test_report_writes_json_markdown_and_png(results, tmp_path):
    results.comparisons = compare(results, TRITON_GRPC, 16)
    paths = write_report(results, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert {r["system"] for r in data["runs"]} == {TRITON_GRPC, ENGINE, STATIC, SERIAL}
    main = next(r for r in data["runs"] if r["system"] == TRITON_GRPC and r["concurrency"] == 32)
    assert main["output_tokens_per_s"] == pytest.approx(300.0)
    assert set(main["ttft_s"]) >= {"p50", "p90", "p99"}
    assert data["comparisons"][0]["value"] == pytest.approx(3.0)
    md = paths["markdown"].read_text()
    assert "| triton-grpc | 32 |" in md and "| transformers-static | batch 16 |" in md
    assert "| decode | 32 | 100 |" in md and "1.30x" in md
    assert "**no**" in md  # the missed 95% goal stands out
    assert "batch 32: 50.00 ms (before 49.00, after 51.00)" in md
    assert "| engine c=32 | decode | 100 | 62.40 |" in md  # forward mean from the step stats
    assert "bench.png" in md
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_that_guessed_report_their_acceptance_rate(results, tmp_path):
    main = next(r for r in results.runs if r.summary.system == TRITON_GRPC and r.summary.concurrency == 32)
    main.server_counters = dict(zip(SPECULATION_COUNTERS, (100.0, 1200.0, 900.0), strict=True))
    md = write_report(results, tmp_path)["markdown"].read_text()
    row = next(line for line in md.splitlines() if line.startswith("| triton-grpc | 32 |"))
    assert row.endswith("| 75% of 1,200 |")
    assert next(line for line in md.splitlines() if line.startswith("| engine | 32 |")).endswith("| - |")


def test_paired_ttft_compares_each_request_with_itself(results):
    results.find(ENGINE, 1).ttft_by_request = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.9}
    results.find(TRITON_GRPC, 1).ttft_by_request = {0: 0.102, 1: 0.202, 2: 0.302, 3: 0.302, 9: 5.0}  # 9: no pair
    paired = by_name(compare(results, TRITON_GRPC, 16), "TTFT at concurrency 1, median of per-request")
    assert paired.value == pytest.approx(2.0)  # request 3 (-600 ms) and the unpaired 9 do not move the median
