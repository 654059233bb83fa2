"""Whether a served stream's per-token time grows with its answer beyond what the model's own step does.

    python tools/bench_served_growth.py --tokens 768 --window 64

One greedy answer of --tokens tokens (EOS ignored, --speculate 0, the default model), streamed twice on the
same machine: in process (`LLM.stream`: the engine alone) and served (the launcher on free 127.0.0.1 ports,
OpenAI's chat completions streamed through the `openai` client). For each, the median gap between tokens
in the first --window tokens (after the first 16) and in the last --window. The step itself grows with
the context (attention reads more K/V); the served path's own cost, served minus in-process at each end,
should not. Prints a markdown table; `--out` also writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QUESTION = "Write a long story about a lighthouse keeper and the ships she guided through a winter of storms."


def ends(stamps: list[float], window: int) -> tuple[float, float]:
    """Median gaps (ms) between consecutive stamps in the first `window` after 16, and in the last `window`."""
    gaps = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:], strict=False)]
    return statistics.median(gaps[16 : 16 + window]), statistics.median(gaps[-window:])


def in_process(tokens: int, flags: dict) -> list[float]:
    from tgi_llm import LLM
    from tgi_llm.events import TokenEvent

    with LLM(None, speculate=0, **flags) as llm:
        prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                                   add_generation_prompt=True)
        params = {"max_new_tokens": tokens, "ignore_eos": True}
        list(llm.stream(prompt, {**params, "max_new_tokens": 8}))  # warm
        return [time.perf_counter() for event in llm.stream(prompt, params) if isinstance(event, TokenEvent)]


def served(tokens: int, flags: list[str], log: Path) -> list[float]:
    from openai import OpenAI

    from tgi_llm.bench.server import launch
    from tgi_llm.ports import free_ports

    (port,) = free_ports(1)
    server = launch(["--speculate", "0", "--port", str(port), *flags], log)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the API answers once the model is ready
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-")
        messages = [{"role": "user", "content": QUESTION}]
        client.chat.completions.create(model="tgi", messages=messages, max_tokens=8)  # warm
        stamps = []
        stream = client.chat.completions.create(model="tgi", messages=messages, max_tokens=tokens, stream=True,
                                                extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                stamps.append(time.perf_counter())
        return stamps
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=768)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--log", type=Path, default=Path("/tmp/bench_served_growth.log"), help="the server's log")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = {"in process": in_process(args.tokens, {"kv_cache_dtype": args.kv_cache_dtype}),
            "served (OpenAI chat, streamed)": served(args.tokens, ["--kv-cache-dtype", args.kv_cache_dtype],
                                                     args.log)}
    print(f"| path | tokens | first {args.window} ms/token | last {args.window} | growth |")
    print("| --- | --- | --- | --- | --- |")
    results = {}
    for name, stamps in rows.items():
        first, last = ends(stamps, args.window)
        results[name] = {"tokens": len(stamps), "first_ms": first, "last_ms": last}
        print(f"| {name} | {len(stamps)} | {first:.2f} | {last:.2f} | {last - first:+.2f} |")
    (inner, outer) = results.values()
    print(f"served minus in process: {outer['first_ms'] - inner['first_ms']:+.2f} ms at the start, "
          f"{outer['last_ms'] - inner['last_ms']:+.2f} ms at the end")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
