"""The load generator: send a request set through a client at a fixed concurrency or a Poisson rate.

Fixed concurrency keeps `concurrency` requests in flight, sending the next as soon as one ends (the
"closed loop" of vLLM's `--max-concurrency` with infinite rate). A Poisson rate sends at exponential
inter-arrival times (seeded), optionally capped at `concurrency` in flight. Either way the request count
and the wall time are bounded: past `timeout_s` the requests still open are cancelled (the client is then
closed) and counted failed.
"""

from __future__ import annotations

import math
import queue
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tgi_llm.bench.clients import StreamClient
from tgi_llm.bench.stats import RequestRecord, wall_time
from tgi_llm.bench.workload import BenchRequest


@dataclass(frozen=True)
class LoadSpec:
    concurrency: int | None  # None: no cap (rate must be set)
    request_rate: float | None = None  # requests/s; None: send as fast as concurrency allows
    seed: int = 0
    timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.concurrency is None and self.request_rate is None:
            raise ValueError("a load needs a concurrency, a request rate, or both")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError("request rate must be > 0")


def arrival_offsets(n: int, rate: float | None, seed: int) -> list[float]:
    """Seconds after the start at which each request may be sent: all 0 without a rate, else a Poisson
    process (exponential gaps with mean 1/rate), the first request at 0."""
    if rate is None or math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for i in range(n):
        offsets.append(t)
        if i < n - 1:
            t += rng.expovariate(rate)
    return offsets


def run_load(client: StreamClient, requests: Sequence[BenchRequest], load: LoadSpec,
             progress: bool = True, desc: str = "") -> tuple[list[RequestRecord], float]:
    """Run every request once; returns the records (in request order) and the wall time in seconds.
    The client stays open for the next run unless this one timed out."""
    from tqdm import tqdm

    records = [RequestRecord(r.index, r.input_len, r.output_len) for r in requests]
    offsets = arrival_offsets(len(requests), load.request_rate, load.seed)
    cap = load.concurrency or len(requests)
    finished: queue.SimpleQueue[RequestRecord] = queue.SimpleQueue()
    bar = tqdm(total=len(requests), desc=desc or client.name, file=sys.stderr, disable=not progress,
               unit="req", leave=False)
    client.prepare(min(cap, len(requests)))
    t0 = time.perf_counter()
    deadline = t0 + load.timeout_s
    sent = in_flight = 0
    timed_out = False
    try:
        while sent < len(requests) or in_flight:
            now = time.perf_counter()
            while sent < len(requests) and in_flight < cap and now >= t0 + offsets[sent]:
                client.start(requests[sent], records[sent], finished.put)
                sent, in_flight = sent + 1, in_flight + 1
                now = time.perf_counter()
            if now >= deadline:
                timed_out = True
                break
            wait = deadline - now
            if sent < len(requests) and in_flight < cap:
                wait = min(wait, t0 + offsets[sent] - now)
            try:
                finished.get(timeout=max(wait, 0.0))
            except queue.Empty:
                continue
            in_flight -= 1
            bar.update(1)
            while True:  # everything else that ended meanwhile
                try:
                    finished.get_nowait()
                except queue.Empty:
                    break
                in_flight -= 1
                bar.update(1)
    finally:
        bar.close()
        if timed_out:
            client.close(cancel=True)
    for i, record in enumerate(records):
        if record.end is None and record.error is None:
            if i >= sent:
                record.error = f"not sent within {load.timeout_s:g} s" if timed_out else "not sent"
            else:
                record.error = f"not finished within {load.timeout_s:g} s"
    return records, wall_time(records)
