"""The responder alone, driven event by event: merging, ordering, failures, shutdown."""

from __future__ import annotations

import time

from tgi_llm.errors import CancelledError
from tgi_llm.events import ErrorEvent, FinalEvent, FinishReason, Token, TokenEvent
from tgi_llm.triton.responder import Live, Responder
from tgi_llm.triton.status import triton_code

from .fakes import FakeApi, FakeSender

WAIT = 30.0


def tok(i: int, text: str) -> TokenEvent:
    return TokenEvent(1, i, Token(100 + i, text, -0.1))


def final(n: int, text: str) -> FinalEvent:
    return FinalEvent(1, text, FinishReason.EOS_TOKEN, n, 2, None, [])


class Handle:
    def __init__(self) -> None:
        self.cancels = 0

    def cancel(self) -> None:
        self.cancels += 1


def started(api: FakeApi | None = None) -> Responder:
    responder = Responder(api or FakeApi(), poll_interval_s=0.005)
    responder.start()
    return responder


def test_final_that_comes_apart_from_its_last_token_adds_an_empty_final_response():
    responder = started()
    sender = FakeSender()
    responder.register(1, Live(sender, stream=True, details=False))
    emit = responder.callback(1)
    for i, text in enumerate("ab"):
        emit(tok(i, text))
        while len(sender.responses) < i + 1:  # each token out before the next (and the final) arrives
            time.sleep(0.001)
    emit(final(2, "ab"))
    assert sender.done.wait(WAIT)
    responder.stop()
    assert [r.text() for r in sender.responses] == ["a", "b", ""]
    assert [r.final for r in sender.responses] == [False, False, True]
    assert sender.responses[-1].outputs["finish_reason"][0] == b"eos_token"


def test_a_steps_tokens_go_out_as_one_response_and_the_last_ones_with_the_final():
    responder = Responder(FakeApi(), poll_interval_s=0.005)
    sender = FakeSender()
    responder.register(1, Live(sender, stream=True, details=True))
    emit = responder.callback(1)
    for i, text in enumerate("abc"):  # queued before the thread starts: one batch, as a step's tokens are
        emit(tok(i, text))
    responder.start()
    while not sender.responses:
        time.sleep(0.001)
    emit(tok(3, "d"))
    emit(TokenEvent(1, 4, Token(104, "e", -0.1), last=True))
    emit(final(5, "abcde"))
    assert sender.done.wait(WAIT)
    responder.stop()
    assert [r.text() for r in sender.responses] == ["abc", "de"]
    assert sender.responses[0].outputs["token_ids"].tolist() == [100, 101, 102]
    assert [r.final for r in sender.responses] == [False, True]


def test_tokens_already_generated_go_out_before_an_error():
    responder = started()
    sender = FakeSender()
    responder.register(1, Live(sender, stream=True, details=False))
    emit = responder.callback(1)
    emit(tok(0, "a"))
    emit(ErrorEvent(1, CancelledError()))
    assert sender.done.wait(WAIT)
    responder.stop()
    assert sender.responses[0].text() == "a" and not sender.responses[0].final
    assert triton_code(sender.responses[-1].error) == "CANCELLED"


def test_cancellation_is_polled_and_forwarded_once():
    api = FakeApi()
    responder = started(api)
    sender, handle = FakeSender(cancelled=True), Handle()
    responder.register(1, Live(sender, stream=False, details=False, handle=handle))
    while api.cancel_checks == 0:
        time.sleep(0.001)
    while handle.cancels == 0:
        time.sleep(0.001)
    responder.callback(1)(ErrorEvent(1, CancelledError()))
    assert sender.done.wait(WAIT)
    responder.stop()
    assert handle.cancels == 1


def test_stop_ends_every_live_request_with_an_error():
    responder = started()
    senders = [FakeSender() for _ in range(3)]
    for key, sender in enumerate(senders):
        responder.register(key, Live(sender, stream=True, details=False))
    responder.stop()
    for sender in senders:
        assert len(sender.finals) == 1 and triton_code(sender.finals[0].error) == "UNAVAILABLE"


class FlakyApi(FakeApi):
    """Sending to the first sender fails (its client went away)."""

    def __init__(self, broken: FakeSender) -> None:
        super().__init__()
        self.broken = broken

    def send(self, sender, outputs, error, final):
        if sender is self.broken:
            raise RuntimeError("client gone")
        super().send(sender, outputs, error, final)


def test_a_failing_send_does_not_affect_other_requests():
    broken, ok = FakeSender(), FakeSender()
    responder = started(FlakyApi(broken))
    responder.register(1, Live(broken, stream=False, details=False))
    responder.register(2, Live(ok, stream=False, details=False))
    responder.callback(1)(final(1, "x"))
    responder.callback(2)(FinalEvent(2, "y", FinishReason.LENGTH, 1, 1, None, []))
    assert ok.done.wait(WAIT)
    responder.stop()
    assert ok.responses[0].text() == "y" and responder.live_count == 0


def test_memory_is_trimmed_when_the_last_request_ends_not_while_it_runs():
    from tgi_llm.engine.stats import EngineStats
    from tgi_llm.triton.memory import IdleTrim

    trims: list[int] = []
    idle = IdleTrim(lambda: trims.append(1) or 1)
    stats = EngineStats(queue_size=0, batch_size=0, batch_max_tokens=0, kv_blocks_total=4, kv_blocks_free=4,
                        running=0)
    responder = Responder(FakeApi(), engine_stats=lambda: stats, poll_interval_s=0.005, idle_trim=idle)
    responder.start()
    sender = FakeSender()
    responder.register(1, Live(sender, stream=False, details=False))
    time.sleep(0.05)  # polled while the request is live
    assert trims == []
    responder.callback(1)(final(2, "ok"))
    assert sender.done.wait(WAIT)
    deadline = time.monotonic() + WAIT
    while not trims and time.monotonic() < deadline:
        time.sleep(0.005)
    responder.stop()
    assert trims == [1]


class CountingApi(FakeApi):
    """Reads the success and failure counters at the moment each final response is sent."""

    def __init__(self, families) -> None:
        super().__init__()
        self.families = families
        self.counted_at_final: list[tuple[float, float]] = []

    def send(self, sender, outputs, error, final):
        if final:
            self.counted_at_final.append((self.families.value("tgi_request_success"),
                                          sum(m.value for m in self.families.families["tgi_request_failure"]
                                              .metrics.values())))
        super().send(sender, outputs, error, final)


def test_a_request_is_counted_before_its_final_response_is_sent():
    from tgi_llm.triton.metrics import TgiMetrics

    from .fakes import FakeFamilies

    families = FakeFamilies()
    api = CountingApi(families)
    responder = Responder(api, metrics=TgiMetrics(families, max_input_tokens=10, max_total_tokens=20),
                          poll_interval_s=0.005)
    responder.start()
    ok, failed = FakeSender(), FakeSender()
    responder.register(1, Live(ok, stream=False, details=False))
    responder.callback(1)(final(1, "x"))
    assert ok.done.wait(WAIT)
    responder.register(2, Live(failed, stream=False, details=False))
    responder.callback(2)(ErrorEvent(2, CancelledError()))
    assert failed.done.wait(WAIT)
    responder.stop()
    assert api.counted_at_final == [(1.0, 0.0), (1.0, 1.0)]  # a client that holds its final sees it counted
