"""A decode step against its matmul floor, at fixed batch size and context length, interleaved.

    python tools/bench_decode_floor.py --batch 32 --context 64 128 256 512

The step is `--batch` synthetic sequences of `--context` tokens through the engine's runner (forward +
greedy sampling, as the engine runs it, with its own KV cache); the floor is the same model's linears
alone at that batch size (tgi_llm/bench/floor.py). Step and floor alternate rep by rep, so both see the
same machine; medians are printed as a markdown table. The serving benchmark (`tgi-llm-bench`) reports
the same ratio for the decode steps a real workload produces.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tgi_llm.bench.floor import MatmulFloor  # noqa: E402


def runner_with_own_cache(llm, num_blocks: int, dtype: torch.dtype | None = None):
    """A ModelRunner over the engine's model with a KV cache of `num_blocks` blocks of its own (of `dtype`;
    None: the engine's cache type), so a benchmark leaves the engine's cache untouched."""
    from tgi_llm.kv_cache import allocate_kv_cache
    from tgi_llm.runner.model_runner import ModelRunner

    engine_runner = llm.engine.runner
    model, bs = engine_runner.model, engine_runner.block_size
    caches = allocate_kv_cache(model.config, num_blocks, bs, dtype or engine_runner.kv_caches[0][0].dtype)
    return ModelRunner(model, caches, bs, model.config.vocab_size, engine_runner.device)


def greedy_step_timer(runner, plan) -> Callable[[], float]:
    """A function that runs `plan`'s decode step (forward + greedy sampling, as the engine's runner does it)
    and returns its seconds."""
    from tgi_llm.request import SamplingParams

    batch = len(plan.seqs)
    greedy = [SamplingParams()] * batch

    def step() -> float:
        t0 = time.perf_counter()
        out = runner.sampler(runner.forward_plan(plan)[1], greedy, [None] * batch, None, 0)
        out.next_token_ids.tolist()
        out.logprobs.tolist()
        return time.perf_counter() - t0

    return step


def bench_decode_vs_floor(llm, batch: int, context: int, reps: int) -> dict:
    """A decode step of `batch` sequences at `context` tokens (forward + greedy sampling, as the engine's
    runner does it) against the matmul floor, interleaved; own KV cache, so the engine's stays untouched."""
    from tgi_llm.engine.step_plan import ScheduledSeq, StepPlan

    model = llm.engine.runner.model
    per_seq = -(-context // llm.engine.runner.block_size)
    runner = runner_with_own_cache(llm, batch * per_seq)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    pos = context - 1
    rng = random.Random(0)
    plan = StepPlan([ScheduledSeq(i, pos, [rng.randrange(1000, 20000)], tables[i], samples=True, is_decode=True)
                     for i in range(batch)])
    step = greedy_step_timer(runner, plan)

    floor = MatmulFloor(model, batch)
    step(), floor.run()
    steps, floors = [], []
    for _ in range(reps):
        steps.append(step())
        floors.append(floor.run())
    s, f = statistics.median(steps), statistics.median(floors)
    return {"batch": batch, "context": context, "step_ms": s * 1e3, "floor_ms": f * 1e3, "step_over_floor": s / f,
            "ratios": sorted(a / b for a, b in zip(steps, floors, strict=True))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON")
    args = ap.parse_args(argv)

    from tgi_llm import LLM
    from tgi_llm.weights import resolve_model_dir

    results = []
    with LLM(str(resolve_model_dir(args.model_id)), kv_cache_memory_gb=0.5) as llm:
        print("| batch | context | step ms | floor ms | step / floor |\n|---|---|---|---|---|")
        for context in args.context:
            r = bench_decode_vs_floor(llm, args.batch, context, args.reps)
            results.append(r)
            print(f"| {r['batch']} | {r['context']} | {r['step_ms']:.1f} | {r['floor_ms']:.1f} | "
                  f"{r['step_over_floor']:.2f}x |", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
