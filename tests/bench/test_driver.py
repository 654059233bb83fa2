"""The load driver against a fake streaming client: concurrency cap, Poisson arrivals, time bound."""

from __future__ import annotations

import threading
import time

import pytest

from tgi_llm.bench.driver import LoadSpec, arrival_offsets, run_load
from tgi_llm.bench.workload import BenchRequest


class FakeClient:
    """Streams `output_len` tokens per request from a timer thread; `hang` requests never end. With
    `hold_until`, streams wait (up to 10 s) until that many are in flight, so a slow host cannot finish
    the first requests before the driver has started the rest."""

    name = "fake"

    def __init__(self, token_gap_s: float = 0.002, hang: set[int] | None = None,
                 hold_until: int | None = None) -> None:
        self.gap, self.hang = token_gap_s, hang or set()
        self.hold_until, self.full = hold_until, threading.Event()
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.sent_at: list[float] = []
        self.closed_with: bool | None = None
        self.prepared = 0

    def prepare(self, in_flight: int) -> None:
        self.prepared = in_flight

    def start(self, request, record, done) -> None:
        record.start = time.perf_counter()
        self.sent_at.append(record.start)
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.in_flight == self.hold_until:
                self.full.set()
        if request.index in self.hang:
            return

        def stream() -> None:
            if self.hold_until is not None:
                self.full.wait(10.0)
            for _ in range(request.output_len):
                time.sleep(self.gap)
                record.token_times.append(time.perf_counter())
            record.reported_output_tokens = request.output_len
            with self.lock:
                self.in_flight -= 1
            record.end = time.perf_counter()
            done(record)

        threading.Thread(target=stream, daemon=True).start()

    def close(self, cancel: bool = False) -> None:
        self.closed_with = cancel


def requests(n: int, output_len: int = 3) -> list[BenchRequest]:
    return [BenchRequest(i, f"p{i}", (1, 2, 3), output_len) for i in range(n)]


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_keeps_at_most_concurrency_in_flight_and_runs_every_request(concurrency):
    client = FakeClient(hold_until=concurrency)
    records, wall = run_load(client, requests(12), LoadSpec(concurrency), progress=False)
    assert [r.index for r in records] == list(range(12))
    assert all(r.ok and r.output_tokens == 3 for r in records)
    assert client.max_in_flight == concurrency
    assert client.prepared == concurrency
    assert client.closed_with is None  # left open for the next run
    assert wall > 0


def test_poisson_offsets_are_seeded_and_have_the_asked_mean_rate():
    offsets = arrival_offsets(4001, rate=50.0, seed=3)
    assert offsets == arrival_offsets(4001, rate=50.0, seed=3)
    assert offsets != arrival_offsets(4001, rate=50.0, seed=4)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert offsets[-1] / 4000 == pytest.approx(1 / 50.0, rel=0.1)
    assert arrival_offsets(3, None, 0) == [0.0, 0.0, 0.0]


def test_a_rate_spreads_the_sends_out():
    client = FakeClient(token_gap_s=0.0)
    run_load(client, requests(6, output_len=1), LoadSpec(None, request_rate=50.0, seed=1), progress=False)
    offsets = arrival_offsets(6, 50.0, 1)
    sent = [t - client.sent_at[0] for t in client.sent_at]
    for want, got in zip(offsets, sent, strict=True):
        assert got >= want - 1e-3  # never early (late is allowed on a busy machine)


def test_the_time_bound_fails_open_requests_and_cancels_them():
    client = FakeClient(hang={1})
    records, _ = run_load(client, requests(3), LoadSpec(3, timeout_s=0.5), progress=False)
    assert records[0].ok and records[2].ok
    assert not records[1].ok and "not finished within" in records[1].error
    assert client.closed_with is True


def test_a_load_needs_a_concurrency_or_a_rate():
    with pytest.raises(ValueError):
        LoadSpec(None, None)
    with pytest.raises(ValueError):
        LoadSpec(0)


def test_requests_never_sent_before_the_time_bound_say_so():
    client = FakeClient(hang={0})
    records, _ = run_load(client, requests(3), LoadSpec(1, timeout_s=0.3), progress=False)  # one at a time
    assert "not finished within" in records[0].error
    assert [r.error for r in records[1:]] == ["not sent within 0.3 s"] * 2
