"""Statistics on synthetic timings: percentiles, TTFT/ITL/TPOT/e2e, tokens counted from the stream."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from tgi_llm.bench.stats import Distribution, RequestRecord, percentile, summarize, wall_time


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001])
def test_percentile_matches_numpy_linear_interpolation(n):
    values = [random.Random(n).uniform(0, 10) for _ in range(n)]
    for q in (0, 1, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)


def test_percentile_interpolates_between_order_statistics():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # unsorted input
    assert percentile([0.0, 10.0], 90) == 9.0
    assert percentile([5.0], 99) == 5.0


def test_percentile_of_nothing_is_nan_and_bad_q_raises():
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def record(index=0, start=10.0, times=(10.5, 10.6, 10.8), end=10.8, expected=3, reported=None, error=None):
    return RequestRecord(index, input_len=5, expected_output_len=expected, start=start, token_times=list(times),
                         end=end, reported_output_tokens=reported, error=error)


def test_record_latencies():
    r = record()
    assert r.ttft == pytest.approx(0.5)
    assert r.itls == pytest.approx([0.1, 0.2])
    assert r.tpot == pytest.approx(0.15)  # (10.8 - 10.5) / 2
    assert r.e2e == pytest.approx(0.8)
    assert r.output_tokens == 3


def test_one_token_has_ttft_but_no_itl_or_tpot():
    r = record(times=(10.2,), end=10.2, expected=1)
    assert r.ttft == pytest.approx(0.2) and r.itls == [] and r.tpot is None


def test_summary_counts_tokens_from_the_stream_and_flags_mismatches():
    records = [
        record(0, reported=3),  # agrees
        record(1, start=10.0, times=(10.1, 10.2), end=10.2, expected=3, reported=3),  # one token never streamed
    ]
    s = summarize("x", records, wall_s=2.0, concurrency=2)
    assert s.output_tokens == 5  # 3 + 2 streamed, not 3 + 3 reported
    assert s.output_tokens_per_s == pytest.approx(2.5)
    assert s.token_count_mismatches == 1
    assert s.length_mismatches == 1
    assert s.requests_per_s == pytest.approx(1.0)
    assert s.input_tokens == 10


def test_summary_pools_itl_over_requests_and_takes_ttft_per_request():
    a = record(0, start=0.0, times=(1.0, 2.0, 3.0), end=3.0)  # gaps 1, 1
    b = record(1, start=0.0, times=(3.0, 3.5), end=3.5, expected=2)  # gap 0.5
    s = summarize("x", [a, b], wall_s=3.5)
    assert s.itl_s.count == 3
    assert s.itl_s.p50 == pytest.approx(1.0)
    assert s.itl_s.mean == pytest.approx(2.5 / 3)
    assert s.ttft_s.p50 == pytest.approx(2.0) and s.ttft_s.max == pytest.approx(3.0)
    assert s.e2e_s.p90 == pytest.approx(3.45)


def test_failed_requests_count_as_failed_not_throughput():
    ok = record(0)
    broken = record(1, error="boom", end=10.3)
    unsent = RequestRecord(2, 5, 3, error="not sent")
    s = summarize("x", [ok, broken, unsent], wall_s=1.0)
    assert (s.completed, s.failed, s.output_tokens) == (1, 2, 3)
    assert s.errors == ["request 1: boom", "request 2: not sent"]


def test_wall_time_spans_first_send_to_last_end_of_sent_requests():
    records = [record(0, start=2.0, end=5.0), record(1, start=3.0, end=7.5), RequestRecord(2, 1, 1)]
    assert wall_time(records) == pytest.approx(5.5)
    assert wall_time([RequestRecord(0, 1, 1)]) == 0.0


def test_empty_distribution_is_nan():
    d = Distribution.of([])
    assert d.count == 0 and math.isnan(d.p50)
