"""Output tokens/s with LoRA adapters against the base model alone, in one run on the default model.

    python tools/bench_lora.py --rank 8 --tokens 64 --rounds 3

Four random PEFT adapters (every projection, rank --rank) over the default model, made with `peft` into a
temporary directory. One engine (--speculate 0, EOS ignored) serves, alternating within each round:
16 greedy streams on the base model; 16 streams spread over the 4 adapters (4 each); one stream on the base;
one stream with an adapter. Reports the median tokens/s of each and the ratios adapters / base. Needs `peft`
(the test extra).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = [f"Story {i}: write about a {topic} in the mountains." for i, topic in enumerate(
    ["fox", "river", "baker", "storm", "train", "garden", "owl", "miner", "violin", "bridge", "comet", "kite",
     "lantern", "glacier", "market", "harbor"])]


def run(llm, adapters: list[str | None], tokens: int) -> float:
    params = [{"max_new_tokens": tokens, "ignore_eos": True} | ({"adapter_id": a} if a else {}) for a in adapters]
    start = time.perf_counter()
    results = llm.generate(PROMPTS[: len(adapters)], params)
    elapsed = time.perf_counter() - start
    return sum(r.generated_tokens for r in results) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from tests.lora.peft_adapters import make_adapter
    from tgi_llm import LLM
    from tgi_llm.weights import resolve_model_dir

    base_dir = resolve_model_dir(None)
    tmp = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    names = [f"a{i}" for i in range(4)]
    spec = ",".join(f"{n}={make_adapter(base_dir, tmp / n, i, r=args.rank, scale=0.05)}" for i, n in enumerate(names))
    cases = {"16 streams, base": [None] * 16, "16 streams, 4 adapters": [names[i % 4] for i in range(16)],
             "1 stream, base": [None], "1 stream, adapter": [names[0]]}
    speeds: dict[str, list[float]] = {case: [] for case in cases}
    with LLM(None, lora_adapters=spec, max_loras=4, speculate=0) as llm:
        for adapters in cases.values():  # warm every path once
            run(llm, adapters, 8)
        for _ in range(args.rounds):
            for case, adapters in cases.items():
                speeds[case].append(run(llm, adapters, args.tokens))
    median = {case: statistics.median(values) for case, values in speeds.items()}
    print(f"| case | output tokens/s (median of {args.rounds}) | vs base |")
    print("| --- | --- | --- |")
    for case, value in median.items():
        base = median["16 streams, base"] if case.startswith("16") else median["1 stream, base"]
        print(f"| {case} | {value:.1f} | {value / base:.2f}x |")


if __name__ == "__main__":
    main()
