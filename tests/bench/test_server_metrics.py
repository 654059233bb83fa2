"""The server's forward totals from its Prometheus text (lines as tritonserver writes them)."""

from __future__ import annotations

import pytest

from tgi_llm.bench.server_metrics import SPECULATION_COUNTERS, acceptance, parse_forward_totals, speculation_counters

BEFORE = """# HELP tgi_batch_forward_duration Seconds per forward pass, by method
# TYPE tgi_batch_forward_duration histogram
tgi_batch_forward_duration_count{method="decode"} 2
tgi_batch_forward_duration_sum{method="decode"} 0.007884198000283504
tgi_batch_forward_duration_bucket{method="decode",le="0.0004"} 0
tgi_batch_forward_duration_count{method="prefill"} 1
tgi_batch_forward_duration_sum{method="prefill"} 0.008587594000346144
tgi_request_count 3
"""
AFTER = BEFORE.replace("_count{method=\"decode\"} 2", "_count{method=\"decode\"} 12").replace(
    "0.007884198000283504", "1.007884198000283504")


def test_difference_of_two_scrapes_gives_steps_and_mean_forward_per_method():
    delta = parse_forward_totals(AFTER).minus(parse_forward_totals(BEFORE))
    assert set(delta) == {"decode"}  # no prefill happened in between
    assert delta["decode"]["steps"] == 10
    assert delta["decode"]["forward_mean_s"] == pytest.approx(0.1)


def test_nothing_to_parse_gives_nothing():
    assert parse_forward_totals("tgi_request_count 3\n").by_method == {}


def test_acceptance_is_the_share_of_guessed_tokens_accepted_in_the_run():
    gained = dict(zip(SPECULATION_COUNTERS, (10.0, 40.0, 30.0), strict=True))
    assert acceptance(gained) == (40.0, 0.75)
    assert acceptance(dict.fromkeys(SPECULATION_COUNTERS, 0.0)) is None  # nothing guessed: no rate, not 0%
    assert acceptance(None) is None  # the counters could not be read


def test_the_engine_counts_under_the_names_the_server_exports():
    class Scheduler:
        num_drafts, num_draft_tokens, num_accepted_tokens = 3, 12, 7

    assert speculation_counters(Scheduler()) == {"vllm:spec_decode_num_drafts": 3.0,
                                                 "vllm:spec_decode_num_draft_tokens": 12.0,
                                                 "vllm:spec_decode_num_accepted_tokens": 7.0}
