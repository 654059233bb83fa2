"""A verify step's cost by its rows, with its short run of tokens served as decode rows (the decode kernel,
one position each) against the prefill kernel, alternately in one process on the default model.

    .venv/bin/python tools/bench_verify_rows.py --context 400 --rows 2 3 5 8

Prints the forward's milliseconds per step for each and their ratio (layer_stack.DECODE_ROWS_MAX).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import tgi_llm.models.layer_stack as layer_stack
from tgi_llm.engine.step_plan import ScheduledSeq, StepPlan
from tgi_llm.llm import LLM
from tgi_llm.runner.batch_inputs import flatten, to_metadata


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 3, 5, 8])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    llm = LLM(None)
    runner, ctx = llm.engine.runner, args.context
    table = list(range(2, 2 + (ctx + max(args.rows) + 15) // 16 + 1))
    runner.forward_plan(StepPlan([ScheduledSeq(0, 0, [1000 + i % 7000 for i in range(ctx)], table, samples=True)]))

    def forward_ms(rows: int) -> float:
        plan = StepPlan([ScheduledSeq(0, ctx, [2000 + i for i in range(rows)], table, samples=True, is_decode=True,
                                      num_drafts=rows - 1)])
        batch = flatten(plan, runner.block_size)
        attn = to_metadata(batch, runner.block_size, torch.device("cpu"))
        ids, positions = torch.tensor(batch.input_ids), torch.tensor(batch.positions)
        with torch.inference_mode():
            runner.model(ids, positions, runner.kv_caches, attn)
            t0 = time.perf_counter()
            for _ in range(args.reps):
                runner.model(ids, positions, runner.kv_caches, attn)
        return 1e3 * (time.perf_counter() - t0) / args.reps

    default = layer_stack.DECODE_ROWS_MAX
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for name, limit in (("prefill kernel", 1), ("decode rows", max(args.rows))):
            layer_stack.DECODE_ROWS_MAX = limit
            for rows in args.rows:
                times.setdefault((name, rows), []).append(forward_ms(rows))
    layer_stack.DECODE_ROWS_MAX = default
    print(f"| rows | prefill kernel ms | decode rows ms | ratio | (context {ctx}) |\n| --- | --- | --- | --- | --- |")
    for rows in args.rows:
        a, b = (statistics.median(times[(n, rows)]) for n in ("prefill kernel", "decode rows"))
        print(f"| {rows} | {a:.2f} | {b:.2f} | {a / b:.2f} | |")
    llm.close()


if __name__ == "__main__":
    main()
