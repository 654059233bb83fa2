"""What a prompt chunk costs per token, by chunk size, after a cached context: the number that decides how
much chunked prefill costs against one big prefill.

    python tools/bench_prefill_chunks.py --cached 512 --tokens 16 32 64 128 256

Each step is one sequence's chunk of `n` new tokens at positions [cached, cached + n) through the engine's
runner (forward + sampling of the last token, as the engine runs a final chunk), with its own KV cache.
Sizes are interleaved rep by rep so all see the same machine; the minimum per size is printed as ms per
token, a markdown table. No assertion: a benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def chunk_steps(llm, cached: int, sizes: list[int]):
    """One step function per chunk size, on a KV cache of the runner's own."""
    from bench_decode_floor import runner_with_own_cache

    from tgi_llm.engine.step_plan import ScheduledSeq, StepPlan
    from tgi_llm.request import SamplingParams

    blocks = -(-(cached + max(sizes)) // llm.engine.runner.block_size)
    runner = runner_with_own_cache(llm, blocks)
    table = list(range(blocks))
    runner.forward_plan(StepPlan([ScheduledSeq(0, 0, [1000 + i % 7000 for i in range(cached)], table,
                                               samples=False)]))  # the cached context, once

    def make(n: int):
        plan = StepPlan([ScheduledSeq(0, cached, [2000 + i % 5000 for i in range(n)], table, samples=True)])

        def step() -> float:
            t0 = time.perf_counter()
            out = runner.sampler(runner.forward_plan(plan)[1], [SamplingParams()], [None], None, 0)
            out.next_token_ids.tolist()
            return time.perf_counter() - t0
        return step
    return {n: make(n) for n in sizes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--cached", type=int, default=512)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quantize", default=None, help="as the launcher's --quantize (default: the model's own)")
    ap.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON")
    args = ap.parse_args(argv)

    from tgi_llm import LLM
    from tgi_llm.weights import resolve_model_dir

    with LLM(str(resolve_model_dir(args.model_id)), kv_cache_memory_gb=0.5, quantize=args.quantize) as llm:
        steps = chunk_steps(llm, args.cached, args.tokens)
        best = {n: float("inf") for n in args.tokens}
        for step in steps.values():
            step()  # warm-up
        for _ in range(args.reps):
            for n, step in steps.items():
                best[n] = min(best[n], step())
    print(f"chunk after {args.cached} cached tokens, min of {args.reps}")
    print("| new tokens | " + " | ".join(str(n) for n in args.tokens) + " |")
    print("|---|" + "---|" * len(args.tokens))
    print("| ms per token | " + " | ".join(f"{best[n] * 1e3 / n:.2f}" for n in args.tokens) + " |")
    print("| ms per chunk | " + " | ".join(f"{best[n] * 1e3:.0f}" for n in args.tokens) + " |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"cached": args.cached, "ms_per_chunk": {n: best[n] * 1e3 for n in best}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
