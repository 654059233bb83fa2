"""`tgi-llm-bench --compare-off prefix-caching|prefill-chunking`: the same workload on two launched servers,
the engine feature on (the default) and off, one after the other in one invocation, and the figures the
engine issue holds each feature to:

- prefix caching, on the multi-turn chat workload: TTFT p50 of turns 2.. at least 5x lower with the cache
  on than off; the hit rate from the server's own counters;
- chunked prefill, on the mixed workload: ITL p99 / ITL p50 <= 3 with chunking on, and output tokens/s on
  at least 0.95x of off.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from tgi_llm.bench.results import TRITON_GRPC, BenchResults, Comparison, SystemRun
from tgi_llm.bench.server_metrics import SPECULATION_COUNTERS
from tgi_llm.bench.stats import Distribution, summarize
from tgi_llm.bench.targets import _judge, _ratio

#: The launcher flag that turns each feature off.
OFF_FLAGS = {"prefix-caching": "--no-prefix-caching", "prefill-chunking": "--no-prefill-chunking"}
COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", *SPECULATION_COUNTERS)


def mode_system(feature: str, mode: str) -> str:
    return f"{TRITON_GRPC}, {feature} {mode}"


def run_modes(args: argparse.Namespace, launcher_flags: list[str], workload: Any, results: BenchResults,
              run_workload: Any) -> None:
    """Launch, warm up, run the workload (`run_workload(client) -> (records, wall)`), stop: once with the
    feature on, once off. Each run's summary and the server counters it moved go into `results`."""
    from tgi_llm.bench.clients import GrpcStreamClient
    from tgi_llm.bench.driver import LoadSpec, run_load
    from tgi_llm.bench.server import launch
    from tgi_llm.bench.server_metrics import read_counters, read_forward_totals
    from tgi_llm.bench.workload import BenchRequest

    feature = args.compare_off
    for mode in ("on", "off"):
        flags = launcher_flags + ([OFF_FLAGS[feature]] if mode == "off" else [])
        print(f"launching the server ({feature} {mode}) ...", flush=True)
        server = launch(flags, Path(args.out_dir) / f"launcher-{feature}-{mode}.log", args.launch_timeout_s)
        try:
            client = GrpcStreamClient(server.grpc_url, args.ignore_eos)
            short = [BenchRequest(i, "Warm-up request number " + str(i), (), 2) for i in range(args.concurrency)]
            run_load(client, short, LoadSpec(args.concurrency, timeout_s=args.timeout_s), progress=False)
            counters_before = read_counters(server.metrics_url, COUNTERS)
            forward_before = read_forward_totals(server.metrics_url)
            records, wall = run_workload(client, f"{feature} {mode}")
            client.close()
            time.sleep(0.3)  # the server's responder publishes its stats every 100 ms
            counters_after = read_counters(server.metrics_url, COUNTERS)
            forward_after = read_forward_totals(server.metrics_url)
        finally:
            server.stop()
        gained = ({k: counters_after[k] - counters_before[k] for k in COUNTERS}
                  if counters_before and counters_after else None)
        steps = forward_after.minus(forward_before) if forward_before and forward_after else None
        results.runs.append(SystemRun(
            summarize(mode_system(feature, mode), records, wall, args.concurrency),
            server_steps=steps, ttft_by_request={r.index: r.ttft for r in records if r.ok and r.ttft is not None},
            server_counters=gained))


def turn_ttfts(run: SystemRun, turns: int, first_turn: int, last_turn: int | None = None) -> Distribution:
    """TTFTs of the turns first_turn..last_turn (0-based) of a multi-turn run (request index = c * turns + t)."""
    last = turns - 1 if last_turn is None else last_turn
    return Distribution.of(t for i, t in (run.ttft_by_request or {}).items() if first_turn <= i % turns <= last)


def hit_rate(run: SystemRun) -> float | None:
    c = run.server_counters
    if not c or not c.get("vllm:prefix_cache_queries"):
        return None
    return c["vllm:prefix_cache_hits"] / c["vllm:prefix_cache_queries"]


def compare_modes(results: BenchResults) -> list[Comparison]:
    feature = results.meta["compare_off"]
    on, off = (results.find(mode_system(feature, m)) for m in ("on", "off"))
    if on is None or off is None:
        return []
    missing = "not measured in this run"
    if feature == "prefix-caching":
        turns = results.workload.get("turns")
        if not turns:
            return [_judge("output tokens/s, cache on / off", _ratio(on.summary.output_tokens_per_s,
                                                                      off.summary.output_tokens_per_s), "x", None,
                           "cache on", "cache off", missing)]
        later_on, later_off = turn_ttfts(on, turns, 1), turn_ttfts(off, turns, 1)
        first_on, first_off = turn_ttfts(on, turns, 0, 0), turn_ttfts(off, turns, 0, 0)
        rate = hit_rate(on)
        return [
            _judge(f"TTFT p50 of turns 2-{turns}, cache off / on", _ratio(_p50(later_off), _p50(later_on)), "x",
                   (">=", 5.0), "cache off", "cache on", missing),
            _judge("TTFT p50 of turn 1, cache off / on", _ratio(_p50(first_off), _p50(first_on)), "x", None,
                   "cache off", "cache on", missing),
            _judge("prefix-cache hit rate, cache on (hit / queried prompt tokens)", rate, "x", None,
                   "vllm:prefix_cache_hits", "vllm:prefix_cache_queries", missing),
            _judge("output tokens/s, cache on / off", _ratio(on.summary.output_tokens_per_s,
                                                             off.summary.output_tokens_per_s), "x", None,
                   "cache on", "cache off", missing),
        ]
    spread_on = _ratio(on.summary.itl_s.p99, on.summary.itl_s.p50)
    spread_off = _ratio(off.summary.itl_s.p99, off.summary.itl_s.p50)
    return [
        _judge("ITL p99 / ITL p50, chunking on", spread_on, "x", ("<=", 3.0), "ITL p99", "ITL p50", missing),
        _judge("ITL p99 / ITL p50, chunking off", spread_off, "x", None, "ITL p99", "ITL p50", missing),
        _judge("output tokens/s, chunking on / off", _ratio(on.summary.output_tokens_per_s,
                                                            off.summary.output_tokens_per_s), "x", (">=", 0.95),
               "chunking on", "chunking off", missing),
        _judge("TTFT p50, chunking off / on", _ratio(off.summary.ttft_s.p50, on.summary.ttft_s.p50), "x", None,
               "chunking off", "chunking on", missing),
    ]


def _p50(d: Distribution) -> float | None:
    return None if d.count == 0 or math.isnan(d.p50) else d.p50
