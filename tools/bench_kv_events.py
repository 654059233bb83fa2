"""What publishing KV events costs: output tokens/s with --kv-events-endpoint on and off, in one run.

    python tools/bench_kv_events.py --tokens 128 --rounds 10

Two engines on the default model in this process, one publishing to a pyzmq SUB socket bound here (a router
taking every batch), the other not. Each round runs 16 greedy streams (EOS ignored) on both, in alternating
order, with prompts new to the round so every block is stored anew and older ones are evicted. Reports the
median tokens/s of each (the first round left out: warm-up) and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def subscriber(endpoint: str) -> list[int]:
    """Bind a SUB at `endpoint` and count the batches it receives, on a daemon thread."""
    import zmq

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(endpoint)
    received = [0]

    def drain() -> None:
        while True:
            sub.recv_multipart()
            received[0] += 1

    threading.Thread(target=drain, daemon=True).start()
    return received


def tokens_per_s(llm, round_no: int, tokens: int) -> float:
    prompts = [f"Round {round_no}: write a long story about animal number {i}." for i in range(16)]
    start = time.perf_counter()
    results = llm.generate(prompts, {"max_new_tokens": tokens, "ignore_eos": True})
    return sum(r.generated_tokens for r in results) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    from tgi_llm import LLM
    from tgi_llm.ports import free_ports

    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    received = subscriber(endpoint)
    limits = {"max_input_tokens": 512, "max_total_tokens": 1024, "max_batch_total_tokens": 16384}
    engines = {"off": LLM(**limits), "on": LLM(kv_events_endpoint=endpoint, **limits)}
    rates: dict[str, list[float]] = {name: [] for name in engines}
    try:
        for r in range(args.rounds):
            order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
            for name in order:
                rates[name].append(tokens_per_s(engines[name], r, args.tokens))
    finally:
        for llm in engines.values():
            llm.close()
    medians = {name: statistics.median(values[1:] or values) for name, values in rates.items()}
    for name, values in rates.items():
        print(f"events {name}: median {medians[name]:.1f} tok/s  (rounds: {', '.join(f'{v:.0f}' for v in values)})")
    print(f"on / off: {medians['on'] / medians['off']:.3f}; batches received: {received[0]}")


if __name__ == "__main__":
    main()
