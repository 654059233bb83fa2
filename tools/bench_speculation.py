"""Speculative decoding against none, in one process on one engine: each request runs with the server's
`--speculate N` and again with `speculate: 0` (the request-level override), alternately, so both see the
same machine state. Prints output tokens/s per workload, the ratio, and the acceptance rate.

    .venv/bin/python tools/bench_speculation.py --speculate 4 --rounds 2

Workloads (greedy, chat template): `grounded` one stream on input-grounded tasks (rewrite, correct,
annotate, summarise with quotes, edit code); `chat` one stream on open-ended questions; `mixed16` 16
streams at once, half of each.
"""

from __future__ import annotations

import argparse
import queue
import random
import statistics
import time

from tgi_llm.events import ErrorEvent, FinalEvent
from tgi_llm.llm import LLM

SENTENCES = [
    "The billing service moved to the new cluster on Monday after three weeks in staging.",
    "Invoices, refunds and monthly renewals now run as separate queues with their own retries.",
    "Customers in the European region saw lower latency because their requests stay in Frankfurt.",
    "The on-call engineer rolled back one deploy on Tuesday when the refund queue stalled for ten minutes.",
    "A missing index on the payments table caused the stall; adding it cut the query time from 2 s to 40 ms.",
    "Support tickets about duplicate charges fell from about 30 a week to 4 after the idempotency keys shipped.",
    "The team plans to retire the old cron jobs by the end of the quarter and move reports to the warehouse.",
    "Finance asked for a daily export of failed payments with the customer id, amount, currency and reason.",
    "Load tests showed the new service handles 1,200 requests per second on four nodes with headroom to spare.",
    "The next milestone is multi-currency support, starting with the euro, the pound and the Japanese yen.",
]
CODE = '''def total_price(items, tax_rate):
    total = 0
    for item in items:
        total = total + item["price"] * item["quantity"]
    total = total + total * tax_rate
    return round(total, 2)


def apply_discount(total, code):
    if code == "SPRING10":
        return total * 0.9
    if code == "VIP":
        return total * 0.8
    return total
'''
TASKS = [
    "Rewrite the following text in the past tense where needed, keeping every sentence:\n\n{}",
    "Correct any spelling mistakes in this text and return the full corrected text:\n\n{}",
    "Repeat this text, adding the word [NOTE] before each sentence that mentions a number:\n\n{}",
    "Summarise this text, quoting its most important sentences word for word:\n\n{}",
    "Rename the variable `total` to `amount` in this code and return the whole code:\n\n" + CODE + "{}",
]
QUESTIONS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are the main differences between a cat and a dog as pets? Answer in a few paragraphs.",
    "Explain how a rainbow forms, for a ten-year-old.",
    "Give me a plan for learning to play the guitar in three months.",
    "Describe a perfect autumn day in the mountains.",
]


def grounded_text(rng: random.Random, n: int = 6) -> str:
    text = " ".join(rng.sample(SENTENCES, n))
    words = text.split()
    for _ in range(2):  # a couple of typos for the correcting task
        i = rng.randrange(len(words))
        if len(words[i]) > 4:
            w = words[i]
            words[i] = w[:2] + w[3] + w[2] + w[4:]
    return " ".join(words)


def prompts(tokenizer, kind: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if kind == "grounded":
            task = TASKS[i % len(TASKS)]
            content = task.format("" if "{}" not in task or task.endswith(CODE + "{}") else grounded_text(rng))
        else:
            content = QUESTIONS[i % len(QUESTIONS)]
        out.append(tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                 add_generation_prompt=True))
    return out


def run(llm: LLM, texts: list[str], speculate: int | None, max_tokens: int) -> tuple[float, int, int, int]:
    """All `texts` at once; (seconds, output tokens, draft tokens, accepted)."""
    done: queue.SimpleQueue = queue.SimpleQueue()
    params = {"max_new_tokens": max_tokens}
    if speculate is not None:
        params["speculate"] = speculate
    t0 = time.perf_counter()
    for text in texts:
        llm.submit(text, params, lambda e: done.put(e) if isinstance(e, FinalEvent | ErrorEvent) else None)
    finals = [done.get() for _ in texts]
    dt = time.perf_counter() - t0
    for f in finals:
        if isinstance(f, ErrorEvent):
            raise f.error
    return (dt, sum(f.generated_tokens for f in finals), sum(f.draft_tokens for f in finals),
            sum(f.accepted_draft_tokens for f in finals))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", default=None)
    ap.add_argument("--speculate", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--workloads", default="grounded,chat,mixed16")
    args = ap.parse_args()
    llm = LLM(args.model_id, speculate=args.speculate)
    tok = llm.tokenizer
    run(llm, prompts(tok, "chat", 1, 99), None, 16)  # warm-up
    print(f"| workload | speculate 0 tok/s | speculate {args.speculate} tok/s | ratio | drafts accepted |")
    print("| --- | --- | --- | --- | --- |")
    for workload in args.workloads.split(","):
        rates: dict[str, list[float]] = {"off": [], "on": []}
        drafted = accepted = 0
        for r in range(args.rounds):
            if workload == "mixed16":
                batches = [prompts(tok, "grounded", 8, r) + prompts(tok, "chat", 8, r)]
            else:
                batches = [[p] for p in prompts(tok, workload, 5, r)]
            for texts in batches:
                run(llm, texts, 0, 1)  # both modes then find the prompts in the prefix cache
                order = ("off", "on") if r % 2 == 0 else ("on", "off")
                for mode in order:
                    dt, n, d, a = run(llm, texts, 0 if mode == "off" else None, args.max_tokens)
                    rates[mode].append(n / dt)
                    if mode == "on":
                        drafted, accepted = drafted + d, accepted + a
        off, on = statistics.mean(rates["off"]), statistics.mean(rates["on"])
        rate = f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "none drafted"
        print(f"| {workload} | {off:.1f} | {on:.1f} | {on / off:.3f} | {rate} |", flush=True)
    llm.engine.shutdown()


if __name__ == "__main__":
    main()
