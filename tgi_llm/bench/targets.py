"""The figures issue 6 holds the server to, each a ratio or difference of two numbers from this run.

Goals (main concurrency C, static batch B; the issue states them for the mixed workload, 64 requests, C=32):
- Triton output tokens/s >= 3x transformers static batching (batch B), same requests;
- Triton output tokens/s >= 95% of the engine called in-process, same requests and concurrency;
- TTFT p50 at concurrency 1: Triton within 5 ms of the engine called in-process;
- a decode step at batch C (the in-process engine's, forward + bookkeeping) <= 1.3x its matmul floor;
- scheduler and bookkeeping CPU time < 5% of a decode step at batch C.
"""

from __future__ import annotations

import math
import operator

from tgi_llm.bench.results import ENGINE, SERIAL, STATIC, BenchResults, Comparison
from tgi_llm.bench.stats import percentile
from tgi_llm.bench.steps import find

Goal = tuple[str, float]  # (">=", 3.0), ("<=", 1.3), ("<", 0.05)
_OPS = {">=": operator.ge, "<=": operator.le, "<": operator.lt}


def _judge(name: str, value: float | None, unit: str, goal: Goal | None, num: str, den: str,
           note: str = "") -> Comparison:
    if value is not None and math.isnan(value):
        value = None
    met = None if value is None or goal is None else _OPS[goal[0]](value, goal[1])
    return Comparison(name, value, unit, f"{goal[0]} {goal[1]:g}" if goal else "", met, num, den,
                      note if value is None else "")


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den is not None and den > 0 else None


def compare(results: BenchResults, server: str, static_batch: int | None) -> list[Comparison]:
    c = results.main_concurrency
    rate = results.meta.get("request_rate")

    def tps(system: str, concurrency: int | None = None, r: float | None = None) -> float | None:
        run = results.find(system, concurrency, r)
        return run.summary.output_tokens_per_s if run and run.summary.completed else None

    served, engine = tps(server, c, rate), tps(ENGINE, c, rate)
    static_name = f"transformers static batch {static_batch}" if static_batch else "transformers static batching"
    static, serial = tps(STATIC), tps(SERIAL)
    missing = "not measured in this run"
    out = [
        _judge(f"{server} / {static_name}, output tokens/s", _ratio(served, static), "x",
               (">=", 3.0), f"{server} c={c}", static_name, missing),
        _judge(f"{server} / engine in-process, output tokens/s at concurrency {c}"
               + (f", Poisson {rate:g} req/s" if rate else ""), _ratio(served, engine), "x",
               (">=", 0.95), f"{server} c={c}", f"engine c={c}", missing),
        _ttft_gap(results, server),
        _ttft_paired(results, server),
        *_decode_step(results, c),
        _judge(f"{server} / one request at a time (transformers), output tokens/s", _ratio(served, serial), "x",
               None, f"{server} c={c}", "transformers batch 1", missing),
        _judge(f"engine in-process / {static_name}, output tokens/s",
               _ratio(engine, static), "x", None, f"engine c={c}", static_name, missing),
    ]
    return out


def _ttft_gap(results: BenchResults, server: str) -> Comparison:
    a, b = results.find(server, 1), results.find(ENGINE, 1)
    gap = None
    if a is not None and b is not None and a.summary.completed and b.summary.completed:
        gap = (a.summary.ttft_s.p50 - b.summary.ttft_s.p50) * 1e3
    return _judge(f"TTFT p50 at concurrency 1: {server} - engine in-process", gap, "ms", ("<=", 5.0),
                  f"{server} c=1", "engine c=1", "concurrency 1 not in the sweep")


def _ttft_paired(results: BenchResults, server: str) -> Comparison:
    """The same gap as a median of per-request differences: each request's prefill length is the same in
    both runs, so pairing removes the spread of prompt lengths that a difference of two p50s carries."""
    a, b = results.find(server, 1), results.find(ENGINE, 1)
    gap = None
    if a and b and a.ttft_by_request and b.ttft_by_request:
        diffs = [a.ttft_by_request[i] - b.ttft_by_request[i] for i in a.ttft_by_request if i in b.ttft_by_request]
        gap = percentile(diffs, 50) * 1e3 if diffs else None
    return _judge(f"TTFT at concurrency 1, median of per-request differences: {server} - engine in-process", gap,
                  "ms", None, f"{server} c=1, each request", "engine c=1, same request",
                  "concurrency 1 not in the sweep")


def _decode_step(results: BenchResults, batch: int) -> list[Comparison]:
    run = results.find(ENGINE, batch, results.meta.get("request_rate"))
    group = find(run.engine_steps or [], "decode", batch) if run else None
    floor = results.floor_at(batch)
    why = ("no in-process engine run" if run is None else f"no decode step at batch {batch}" if group is None
           else "")
    return [
        _judge(f"decode step at batch {batch} / its matmul floor",
               _ratio(group.step_p50_s if group else None, floor.median_s if floor else None), "x", ("<=", 1.3),
               f"engine decode step p50 (forward + bookkeeping), batch {batch}", f"matmul floor p50, batch {batch}",
               why or f"no floor: {results.floor_error}"),
        _judge(f"bookkeeping / decode step time at batch {batch}", group.bookkeeping_share if group else None, "x",
               ("<", 0.05), "engine bookkeeping s (sum over steps)", "engine forward + bookkeeping s (sum)", why),
    ]
