"""Whether a served stream's per-token time grows with its answer beyond what the model's own step does.

    python tools/bench_served_growth.py --tokens 768 --window 64

One greedy answer of --tokens tokens (EOS ignored, --speculate 0, the default model), streamed on the same
machine in process (`LLM.stream`: the engine alone) and served (the launcher on free 127.0.0.1 ports,
OpenAI's chat and completions routes streamed, their events read as they arrive). For each, the median gap
between events in the first --window tokens (after the first 16) and in the last --window, the median over
--repeats answers. The step itself
grows with the context (attention reads more K/V); the served path's own cost, served minus in process at
each end, should not. Prints a markdown table; `--out` also writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import http.client
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


def in_process(tokens: int, flags: dict, repeats: int) -> list[list[float]]:
    from tgi_llm import LLM
    from tgi_llm.events import TokenEvent

    with LLM(None, speculate=0, **flags) as llm:
        prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                                   add_generation_prompt=True)
        params = {"max_new_tokens": tokens, "ignore_eos": True}
        list(llm.stream(prompt, params))  # warm, as served
        return [[time.perf_counter() for event in llm.stream(prompt, params) if isinstance(event, TokenEvent)]
                for _ in range(repeats)]


def served(tokens: int, flags: list[str], log: Path, repeats: int) -> dict[str, list[list[float]]]:
    """Stamps of each streamed event's arrival, per route: read as raw server-sent events (a Python client's
    own parsing, on the same cores, would add its cost to every gap: ~3.5 ms a token with `openai` on 2 vCPUs)."""
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
        common = {"model": "tgi", "max_tokens": tokens, "ignore_eos": True, "stream": True}
        routes = {"served, OpenAI chat": ("/v1/chat/completions",
                                          {**common, "messages": [{"role": "user", "content": QUESTION}]}),
                  "served, OpenAI completions": ("/v1/completions", {**common, "prompt": QUESTION})}
        for route, body in routes.values():  # the server's first long answers run slower (its memory, caches)
            sse_stamps(port, route, body)
        stamps = {name: [] for name in routes}
        for _ in range(repeats):  # the routes in turn, so that each sees the machine alike
            for name, (route, body) in routes.items():
                stamps[name].append(sse_stamps(port, route, body))
        return stamps
    finally:
        server.stop()


def sse_stamps(port: int, route: str, body: dict) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request("POST", route, json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{route}: HTTP {response.status}: {response.read()[:500]!r}")
    stamps = [time.perf_counter() for line in response if line.startswith(b"data:") and b"[DONE]" not in line]
    connection.close()
    return stamps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=768)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="answers a path; the medians of their gaps are shown")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--log", type=Path, default=Path("/tmp/bench_served_growth.log"), help="the server's log")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = {"in process": in_process(args.tokens, {"kv_cache_dtype": args.kv_cache_dtype}, args.repeats),
            **served(args.tokens, ["--kv-cache-dtype", args.kv_cache_dtype], args.log, args.repeats)}
    print(f"| path | tokens | first {args.window} ms/token | last {args.window} | growth |")
    print("| --- | --- | --- | --- | --- |")
    results = {}
    for name, runs in rows.items():
        pairs = [ends(stamps, args.window) for stamps in runs]
        first, last = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        tokens = min(len(stamps) for stamps in runs)
        results[name] = {"tokens": tokens, "first_ms": first, "last_ms": last}
        print(f"| {name} | {tokens} | {first:.2f} | {last:.2f} | {last - first:+.2f} |")
    inner = results["in process"]
    for name, outer in results.items():
        if outer is not inner:
            print(f"{name} minus in process: {outer['first_ms'] - inner['first_ms']:+.2f} ms at the start, "
                  f"{outer['last_ms'] - inner['last_ms']:+.2f} ms at the end")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
