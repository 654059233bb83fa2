#!/usr/bin/env python3
"""Decode steps at batch 32 with every request constrained by its own JSON Schema, against the same
batch unconstrained: the engine in-process, the step time being the forward (masks included) plus the
engine thread's bookkeeping. Runs alternate (plain, constrained, plain, ...) so a drift of the machine
does not favour one; the report is the ratio of the medians.

    .venv/bin/python tools/bench_grammar_decode.py --batch 32 --tokens 96 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def schema(i: int) -> dict:
    """32 different schemas, each too long to finish within the run: every step of it is a masked decode."""
    return {"type": "object", "properties": {
        f"list_{i}": {"type": "array", "items": {"type": "string", "maxLength": 6 + i % 5}, "minItems": 60},
        "done": {"type": "boolean"}}, "required": [f"list_{i}", "done"], "additionalProperties": False}


def run(llm, batch: int, tokens: int, constrained: bool) -> tuple[list[float], list[float], list[float]]:
    """(step times, grammar-mask times, bookkeeping times) of the decode steps at full batch."""
    prompts = [f"Item list number {i}:" for i in range(batch)]
    params = [{"max_new_tokens": tokens, "ignore_eos": True}
              | ({"grammar": {"type": "json", "value": schema(i)}} if constrained else {}) for i in range(batch)]
    llm.engine.drain_step_stats()
    llm.generate(prompts, params)
    steps = [s for s in llm.engine.drain_step_stats() if s.method == "decode" and s.batch_size == batch]
    return ([s.forward_s + s.bookkeeping_s for s in steps], [s.grammar_mask_s for s in steps],
            [s.bookkeeping_s for s in steps])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model-id", default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from tgi_llm import LLM

    with LLM(args.model_id, kv_cache_memory_gb=0.5, max_batch_size=args.batch) as llm:
        run(llm, args.batch, 8, True)  # warm-up: compiles the grammars, first-call costs
        plain, constrained, masks, bookkeeping = [], [], [], []
        for _ in range(args.rounds):
            steps, _, kept = run(llm, args.batch, args.tokens, False)
            plain += steps
            bookkeeping += kept
            steps, mask, _ = run(llm, args.batch, args.tokens, True)
            constrained += steps
            masks += mask
    p, c = statistics.median(plain), statistics.median(constrained)
    result = {"batch": args.batch, "steps": [len(plain), len(constrained)], "plain_step_ms": p * 1e3,
              "constrained_step_ms": c * 1e3, "ratio": c / p,
              "mask_ms_p50": statistics.median(masks) * 1e3 if masks else None,
              # scheduler, KV-cache manager (prefix lookups included) and postprocessing on the engine thread
              "plain_bookkeeping_share": sum(bookkeeping) / sum(plain)}
    print(f"decode step at batch {args.batch}: unconstrained p50 {p * 1e3:.1f} ms ({len(plain)} steps), every request "
          f"constrained p50 {c * 1e3:.1f} ms ({len(constrained)} steps): {c / p:.3f}x; bookkeeping "
          f"{result['plain_bookkeeping_share']:.2%} of the unconstrained steps")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
