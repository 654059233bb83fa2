"""One stream's decode step at long contexts, for each KV-cache type, against the memory-bandwidth limit.

    python tools/bench_kv_cache.py --context 512 2048 8192 32768 --kv-cache-dtype float32 bfloat16 float16 int8

A decode step of one sequence at `--context` tokens (forward + greedy sampling, as the engine's runner does
it) over a KV cache of its own, filled with random values of the asked type. The limit is what the step must
read, the weights' bytes plus the context's K/V bytes, over the read bandwidth measured in the same run (a
sum over a buffer far larger than the caches, on all threads). Types alternate round by round, so they see
the same machine; medians are printed as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tgi_llm.bench.floor import MatmulFloor  # noqa: E402
from tgi_llm.kv_cache import KV_CACHE_TYPES, fill_cache  # noqa: E402


def read_bandwidth(gib: float = 1.0, reps: int = 5) -> float:
    """Bytes a second that a float32 sum over `gib` GiB reads, best of `reps`, on torch's threads."""
    buffer = torch.ones(int(gib * 2**30) // 4)
    buffer.sum()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - t0)
    return buffer.numel() * 4 / best


def decode_step(llm, context: int, dtype: torch.dtype):
    """A function timing one greedy decode step of one sequence at `context` tokens, over a cache of `dtype`
    filled with random values (zero pages would read from nowhere)."""
    from bench_decode_floor import greedy_step_timer, runner_with_own_cache

    from tgi_llm.engine.step_plan import ScheduledSeq, StepPlan

    blocks = -(-context // llm.engine.runner.block_size)
    runner = runner_with_own_cache(llm, blocks, dtype)
    gen = torch.Generator().manual_seed(0)
    for k, v in runner.kv_caches:
        for cache in (k, v):
            fill_cache(cache, torch.randn(cache.shape, generator=gen))
    table = list(range(blocks))
    random.Random(0).shuffle(table)  # a pool's blocks are scattered
    return greedy_step_timer(runner, StepPlan([ScheduledSeq(0, context - 1, [1000], table, samples=True,
                                                            is_decode=True)]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--context", type=int, nargs="+", default=[512, 2048, 8192, 32768])
    ap.add_argument("--kv-cache-dtype", nargs="+", default=list(KV_CACHE_TYPES), choices=list(KV_CACHE_TYPES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON")
    args = ap.parse_args(argv)

    from tgi_llm import LLM
    from tgi_llm.models.config import kv_cache_bytes_per_token
    from tgi_llm.weights import resolve_model_dir

    bandwidth = read_bandwidth()
    times: dict[tuple[str, int], list[float]] = {}
    with LLM(str(resolve_model_dir(args.model_id)), kv_cache_memory_gb=0.2) as llm:
        model = llm.engine.runner.model
        weight_bytes = MatmulFloor(model, 1).weight_bytes
        for _ in range(args.rounds):
            for name in args.kv_cache_dtype:
                for context in args.context:
                    step = decode_step(llm, context, KV_CACHE_TYPES[name])
                    step(), step()  # the fused stack's first-step check, then a warm step
                    times.setdefault((name, context), []).extend(step() for _ in range(args.reps))
                    del step
        results = []
        print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s; weights {weight_bytes / 2**20:.1f} MiB a step\n")
        print("| KV cache | context | ms / token | limit ms | over the limit |\n|---|---|---|---|---|")
        for (name, context), samples in times.items():
            kv_bytes = context * kv_cache_bytes_per_token(model.config, KV_CACHE_TYPES[name])
            limit = (weight_bytes + kv_bytes) / bandwidth
            ms = statistics.median(samples)
            results.append({"kv_cache_dtype": name, "context": context, "ms": ms * 1e3, "limit_ms": limit * 1e3,
                            "weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "bandwidth": bandwidth})
            print(f"| {name} | {context} | {ms * 1e3:.2f} | {limit * 1e3:.2f} | {ms / limit:.2f}x |", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
