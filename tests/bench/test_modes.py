"""The on/off comparisons of --compare-off, from synthetic runs."""

from __future__ import annotations

from tgi_llm.bench.modes import compare_modes, hit_rate, mode_system, turn_ttfts
from tgi_llm.bench.results import BenchResults, SystemRun
from tgi_llm.bench.stats import RequestRecord, summarize


def run(system: str, ttfts: list[float], gaps: list[float], wall: float, counters=None) -> SystemRun:
    records = []
    for i, ttft in enumerate(ttfts):
        r = RequestRecord(i, 10, len(gaps) + 1, start=0.0)
        t = ttft
        r.token_times = [t]
        for g in gaps:
            t += g
            r.token_times.append(t)
        r.end = t
        records.append(r)
    return SystemRun(summarize(system, records, wall, 4), ttft_by_request={r.index: r.ttft for r in records},
                     server_counters=counters)


def test_prefix_caching_compares_later_turns_and_reports_the_hit_rate():
    results = BenchResults({"compare_off": "prefix-caching"}, {"kind": "multi-turn", "turns": 2}, 4)
    # request i is turn i % 2: turn 1 takes 1 s either way, turn 2 0.1 s cached and 1 s not
    results.runs = [
        run(mode_system("prefix-caching", "on"), [1.0, 0.1, 1.0, 0.1], [0.05], 10.0,
            {"vllm:prefix_cache_queries": 1000.0, "vllm:prefix_cache_hits": 600.0}),
        run(mode_system("prefix-caching", "off"), [1.0, 1.0, 1.0, 1.0], [0.05], 20.0),
    ]
    assert turn_ttfts(results.runs[0], 2, 1).p50 == 0.1 and turn_ttfts(results.runs[0], 2, 0, 0).p50 == 1.0
    assert hit_rate(results.runs[0]) == 0.6 and hit_rate(results.runs[1]) is None
    later, first, rate, tps = compare_modes(results)
    assert later.value == 10.0 and later.met is True
    assert first.value == 1.0 and first.met is None
    assert rate.value == 0.6 and tps.value == 2.0


def test_chunking_is_held_to_the_itl_spread_and_the_throughput_it_keeps():
    results = BenchResults({"compare_off": "prefill-chunking"}, {"kind": "mixed"}, 4)
    results.runs = [
        run(mode_system("prefill-chunking", "on"), [0.5] * 4, [0.05] * 98 + [0.1, 0.1], 10.0),
        run(mode_system("prefill-chunking", "off"), [0.5] * 4, [0.05] * 98 + [0.8, 0.8], 9.0),
    ]
    spread_on, spread_off, tps, ttft = compare_modes(results)
    assert spread_on.met is True and spread_on.value < 3
    assert spread_off.value > 3 and spread_off.met is None
    assert tps.value == 0.9 and tps.met is False
    assert ttft.value == 1.0
