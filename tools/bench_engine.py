"""Engine vs transformers' static batching on the same requests, in one run; plus the decode step vs its
matmul floor and the engine's per-step bookkeeping share.

    # the issue-6 workload: 64 requests, at most 32 in flight, lengths drawn from ranges
    python tools/bench_engine.py --num-prompts 64 --concurrency 32 --input-len 32 512 --output-len 32 256 \\
        --static-batch-size 16
    # the older fixed workload: chat prompts, all submitted at once
    python tools/bench_engine.py --num-prompts 16 --max-new-tokens 64 --static-batch-size 8

Engine: a client keeps `--concurrency` requests in flight (a new one is submitted as soon as one ends);
output tokens/s = all generated tokens / (last response - first submit). Transformers: `generate` over
static batches in request order, left padded, each batch running until its longest request is done
(`max_new_tokens` = `min_new_tokens` = the batch's largest request, so EOS never ends a row early);
its output tokens/s counts the tokens the requests asked for, as the engine's does (the tokens a static
batch generates past a request's own length are waste, reported as `generated_tokens`). Both: the same
process, dtype (float32), torch threads and glibc malloc policy, greedy, EOS ignored, models loaded and
warmed up before timing. `--rounds N` alternates the two N times (the machine may be shared) and reports
the median ratio. Decode step vs floor: `--floor-batch` synthetic sequences of `--floor-context` tokens
through the engine's runner (forward + greedy sampling), interleaved with tools/matmul_floor.py's floor.
The bookkeeping share comes from the engine's own StepStats (scheduling + postprocessing vs forward).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tgi_llm.bench.floor import MatmulFloor  # noqa: E402

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

Request = tuple[list[int], int]  # prompt token ids, tokens to generate


def chat_requests(tokenizer, n: int, new_tokens: int) -> list[Request]:
    out = []
    for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)] + (" Please answer in detail." * (i // len(QUESTIONS)))
        text = tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True)
        out.append((tokenizer(text, add_special_tokens=False)["input_ids"], new_tokens))
    return out


def mixed_requests(tokenizer, n: int, input_len: tuple[int, int], output_len: tuple[int, int],
                   seed: int) -> list[Request]:
    """Prompts of exactly the drawn length: windows of real text, so the tokens look like a prompt."""
    rng = random.Random(seed)
    text = " ".join(QUESTIONS) + " "
    corpus = tokenizer(text * (2 + input_len[1] // 64), add_special_tokens=False)["input_ids"]
    out = []
    for _ in range(n):
        length = rng.randint(*input_len)
        start = rng.randrange(len(corpus) - length)
        out.append((corpus[start:start + length], rng.randint(*output_len)))
    return out


def bench_engine(llm, requests: list[Request], concurrency: int) -> dict:
    from tgi_llm.events import ErrorEvent, TokenEvent

    llm.generate([requests[0][0]], {"max_new_tokens": 4})  # warm-up (and builds the CPU kernel)
    llm.engine.drain_step_stats()
    done: queue.SimpleQueue = queue.SimpleQueue()
    todo = list(enumerate(requests))
    todo.reverse()
    in_flight, generated = 0, 0
    t0 = time.perf_counter()
    with tqdm(total=len(requests), desc=f"engine, concurrency {concurrency}", file=sys.stderr) as bar:
        while todo or in_flight:
            while todo and in_flight < concurrency:
                _, (prompt, new_tokens) = todo.pop()
                llm.submit(prompt, {"max_new_tokens": new_tokens, "ignore_eos": True},
                           lambda e: None if isinstance(e, TokenEvent) else done.put(e))
                in_flight += 1
            event = done.get()
            if isinstance(event, ErrorEvent):
                raise event.error
            generated += event.generated_tokens
            in_flight -= 1
            bar.update()
    elapsed = time.perf_counter() - t0
    return {"output_tokens": generated, "seconds": elapsed, "output_tokens_per_s": generated / elapsed,
            "concurrency": concurrency, "steps": step_report(llm.engine.drain_step_stats(), concurrency)}


def step_report(steps: list, batch: int) -> dict:
    """Bookkeeping share over all steps, and per-step medians for the decode steps at `batch`."""
    forward = sum(s.forward_s for s in steps)
    book = sum(s.bookkeeping_s for s in steps)
    full = [s for s in steps if s.method == "decode" and s.batch_size >= batch]
    report = {"count": len(steps), "forward_s": forward, "bookkeeping_s": book,
              "bookkeeping_share": book / (forward + book) if steps else 0.0,
              "prefill_steps": sum(1 for s in steps if s.method == "prefill"),
              "decode_steps_at_batch": len(full)}
    if full:
        fwd = statistics.median(s.forward_s for s in full)
        bk = statistics.median(s.bookkeeping_s for s in full)
        report |= {"decode_at_batch_forward_ms": fwd * 1e3, "decode_at_batch_bookkeeping_ms": bk * 1e3,
                   "decode_at_batch_bookkeeping_share": bk / (fwd + bk)}
    return report


def load_transformers(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def bench_transformers(model, requests: list[Request], batch_size: int, pad_id: int) -> dict:
    from tgi_llm.runner.model_runner import keep_freed_memory_in_heap

    # The engine's runner already set this process-wide; without it transformers' CPU decode steps spend
    # much of their time in page faults, which is not what static batching costs.
    keep_freed_memory_in_heap()
    batches = [requests[i:i + batch_size] for i in range(0, len(requests), batch_size)]
    useful = generated = 0
    with torch.no_grad():
        model.generate(torch.tensor([requests[0][0][:8]]), max_new_tokens=2, pad_token_id=pad_id)  # warm-up
        t0 = time.perf_counter()
        for batch in tqdm(batches, desc=f"transformers static batch {batch_size}", file=sys.stderr):
            width = max(len(p) for p, _ in batch)
            new_tokens = max(n for _, n in batch)
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _ in batch])  # left padding
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, pad_token_id=pad_id)
            generated += (out.shape[1] - width) * len(batch)
            useful += sum(n for _, n in batch)
        elapsed = time.perf_counter() - t0
    return {"output_tokens": useful, "generated_tokens": generated, "seconds": elapsed,
            "output_tokens_per_s": useful / elapsed, "batch_size": batch_size}


def bench_decode_vs_floor(llm, batch: int, context: int, reps: int) -> dict:
    """A decode step of `batch` sequences at `context` tokens (forward + greedy sampling, as the engine's
    runner does it) against the matmul floor, interleaved; own KV cache, so the engine's stays untouched."""
    from tgi_llm.kv_cache import allocate_kv_cache
    from tgi_llm.request import SamplingParams
    from tgi_llm.runner.batch_inputs import StepPlan
    from tgi_llm.runner.model_runner import ModelRunner

    engine_runner = llm.engine.runner
    model = engine_runner.model
    bs = engine_runner.block_size
    per_seq = -(-context // bs)
    caches = allocate_kv_cache(model.config, batch * per_seq, bs, model.embed_tokens.dtype)
    runner = ModelRunner(model, caches, bs, model.config.vocab_size, engine_runner.device)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    pos = context - 1
    rng = random.Random(0)
    plan = StepPlan(input_ids=[rng.randrange(1000, 20000) for _ in range(batch)], positions=[pos] * batch,
                    slot_mapping=[t[pos // bs] * bs + pos % bs for t in tables], query_lens=[1] * batch,
                    seq_lens=[context] * batch, block_tables=tables, logits_indices=list(range(batch)),
                    prompt_logprob_rows=[])
    greedy = [SamplingParams()] * batch

    def step() -> float:
        t0 = time.perf_counter()
        out = runner.sampler(runner.forward_plan(plan), greedy, [None] * batch, None, 0)
        out.next_token_ids.tolist()
        out.logprobs.tolist()
        return time.perf_counter() - t0

    floor = MatmulFloor(model, batch)
    step(), floor.run()
    steps, floors = [], []
    for _ in range(reps):
        steps.append(step())
        floors.append(floor.run())
    s, f = statistics.median(steps), statistics.median(floors)
    return {"batch": batch, "context": context, "step_ms": s * 1e3, "floor_ms": f * 1e3, "step_over_floor": s / f,
            "ratios": sorted(a / b for a, b in zip(steps, floors, strict=True))}


def _median_run(runs: list[dict]) -> dict:
    """The run with the median throughput (its step stats and all), from an odd or even number of rounds."""
    ordered = sorted(runs, key=lambda r: r["output_tokens_per_s"])
    return ordered[(len(ordered) - 1) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=None, help="requests in flight (default: all)")
    ap.add_argument("--input-len", type=int, nargs=2, metavar=("MIN", "MAX"), default=None,
                    help="draw prompt lengths from [MIN, MAX] (default: chat prompts)")
    ap.add_argument("--output-len", type=int, nargs=2, metavar=("MIN", "MAX"), default=None,
                    help="draw output lengths from [MIN, MAX] (default: --max-new-tokens for all)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--static-batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--floor-batch", type=int, default=32)
    ap.add_argument("--floor-context", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--floor-reps", type=int, default=15)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--rounds", type=int, default=1, help="alternate engine and transformers runs this many times")
    ap.add_argument("--out", type=Path, default=Path("bench-results/engine.json"))
    args = ap.parse_args(argv)

    from tgi_llm import LLM
    from tgi_llm.weights import resolve_model_dir

    model_dir = resolve_model_dir(args.model_id)
    with LLM(str(model_dir), kv_cache_memory_gb=1.0) as llm:
        tok = llm.tokenizer
        if args.input_len:
            out_len = args.output_len or (args.max_new_tokens, args.max_new_tokens)
            requests = mixed_requests(tok, args.num_prompts, tuple(args.input_len), tuple(out_len), args.seed)
        else:
            requests = chat_requests(tok, args.num_prompts, args.max_new_tokens)
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        concurrency = args.concurrency or len(requests)
        print(f"engine: {len(requests)} requests, concurrency {concurrency}, threads {torch.get_num_threads()}",
              file=sys.stderr)
        hf = None if args.skip_transformers else load_transformers(model_dir)
        engines, statics, ratios = [], [], []
        for r in range(args.rounds):  # alternated, so both see the same machine (it is shared)
            engines.append(bench_engine(llm, requests, concurrency) | {"loadavg": os.getloadavg()})
            if hf is not None:
                statics.append(bench_transformers(hf, requests, args.static_batch_size, pad_id)
                               | {"loadavg": os.getloadavg()})
                ratios.append(engines[-1]["output_tokens_per_s"] / statics[-1]["output_tokens_per_s"])
                print(f"round {r}: engine {engines[-1]['output_tokens_per_s']:.1f} tok/s, transformers "
                      f"{statics[-1]['output_tokens_per_s']:.1f} tok/s, ratio {ratios[-1]:.2f}", file=sys.stderr)
        floors = [bench_decode_vs_floor(llm, args.floor_batch, c, args.floor_reps) for c in args.floor_context]
    engine = _median_run(engines)
    static = _median_run(statics) if statics else None
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''} {torch.get_num_threads()} threads, "
                   f"torch {torch.__version__}",
        "model": str(model_dir),
        "workload": {"requests": len(requests), "concurrency": concurrency,
                     "input_tokens": sum(len(p) for p, _ in requests), "output_tokens": sum(n for _, n in requests),
                     "input_len": args.input_len, "output_len": args.output_len or args.max_new_tokens,
                     "seed": args.seed},
        "engine": engine,
        "decode_vs_floor": floors,
        "transformers_static": static,
        "engine_over_static": statistics.median(ratios) if ratios else None,
        "rounds": {"engine": engines, "transformers_static": statics, "engine_over_static": ratios},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    steps = engine["steps"]
    lines = ["| measure | value |", "|---|---|",
             f"| engine output tokens/s (concurrency {concurrency}) | {engine['output_tokens_per_s']:.1f} |"]
    if static:
        lines += [f"| transformers static batch {args.static_batch_size} output tokens/s | "
                  f"{static['output_tokens_per_s']:.1f} |",
                  f"| engine / static (median of {len(ratios)} alternated rounds) | "
                  f"{report['engine_over_static']:.2f}x |"]
    lines.append(f"| bookkeeping share, all {steps['count']} steps | {100 * steps['bookkeeping_share']:.2f}% |")
    if "decode_at_batch_forward_ms" in steps:
        lines.append(f"| decode steps at batch {concurrency}: forward / bookkeeping ms (median) | "
                     f"{steps['decode_at_batch_forward_ms']:.1f} / {steps['decode_at_batch_bookkeeping_ms']:.2f} "
                     f"({100 * steps['decode_at_batch_bookkeeping_share']:.2f}%) |")
    for f in floors:
        lines.append(f"| decode step, batch {f['batch']} x context {f['context']}: step / matmul floor ms | "
                     f"{f['step_ms']:.1f} / {f['floor_ms']:.1f} = {f['step_over_floor']:.2f}x |")
    print("\n".join(lines))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
