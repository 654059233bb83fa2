"""The engine loop with a fake runner: events, stop reasons, cancellation, overload, failures."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from tgi_llm.engine import Engine, LimitOptions
from tgi_llm.engine.limits import resolve_limits
from tgi_llm.errors import CancelledError, GenerationError, OverloadedError, ShutdownError, ValidationError
from tgi_llm.events import ErrorEvent, FinalEvent, FinishReason, TokenEvent

from .fake_runner import FakeRunner

TIMEOUT = 20.0


def make_engine(tokenizer, runner, **limit_kw) -> Engine:
    base = dict(max_input_tokens=64, max_total_tokens=128, max_batch_prefill_tokens=256,
                max_batch_total_tokens=2048, waiting_served_ratio=0.0)
    base.update(limit_kw)
    limits = resolve_limits(LimitOptions(**base), max_position_embeddings=None, kv_cache_tokens=None)
    engine = Engine(tokenizer, limits, runner, eos_token_ids={tokenizer.eos_token_id})
    engine.start()
    return engine


class Collector:
    def __init__(self):
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.seen = []

    def __call__(self, event):
        self.events.put(event)

    def wait_end(self):
        while True:
            event = self.events.get(timeout=TIMEOUT)
            self.seen.append(event)
            if isinstance(event, (FinalEvent, ErrorEvent)):
                return event

    def assert_no_more(self):
        time.sleep(0.05)
        assert self.events.empty(), "an event arrived after the final one"


@pytest.fixture
def words(tokenizer):
    return tokenizer(" the quick brown fox jumps", add_special_tokens=False)["input_ids"]


def test_tokens_then_exactly_one_final_with_concatenated_text(tokenizer, words):
    engine = make_engine(tokenizer, FakeRunner(words))
    try:
        c = Collector()
        engine.submit(engine.validate("Hello", {"max_new_tokens": 7}), c)
        final = c.wait_end()
        c.assert_no_more()
        tokens = [e for e in c.seen if isinstance(e, TokenEvent)]
        assert isinstance(final, FinalEvent) and final.finish_reason is FinishReason.LENGTH
        assert [e.index for e in tokens] == list(range(7))
        assert "".join(e.token.text for e in tokens) == final.generated_text
        assert final.generated_text == tokenizer.decode(final.token_ids, skip_special_tokens=True)
        assert final.generated_tokens == 7 and final.input_tokens == len(engine.validate("Hello").input_ids)
        assert engine.stats().kv_blocks_free == engine.stats().kv_blocks_total
    finally:
        engine.shutdown()


def test_eos_and_stop_sequence_end_generation(tokenizer, words):
    eos = tokenizer.eos_token_id
    marker = tokenizer("A", add_special_tokens=False)["input_ids"][0]
    runner = FakeRunner(words, per_prompt={marker: [words[0], words[1], eos]})
    engine = make_engine(tokenizer, runner)
    try:
        c = Collector()
        engine.submit(engine.validate([marker, 5], {"max_new_tokens": 50}), c)
        final = c.wait_end()
        assert final.finish_reason is FinishReason.EOS_TOKEN and final.generated_tokens == 3
        assert tokenizer.eos_token not in final.generated_text
        c2 = Collector()
        engine.submit(engine.validate("Hi", {"max_new_tokens": 50, "stop": [" brown"]}), c2)
        final2 = c2.wait_end()
        assert final2.finish_reason is FinishReason.STOP_SEQUENCE
        assert final2.generated_text.endswith(" brown")
    finally:
        engine.shutdown()


def test_new_requests_join_the_running_batch(tokenizer, words):
    runner = FakeRunner(words, step_delay_s=0.002)
    engine = make_engine(tokenizer, runner)
    try:
        a, b = Collector(), Collector()
        ha = engine.submit(engine.validate("first", {"max_new_tokens": 40}), a)
        a.events.get(timeout=TIMEOUT)  # a is decoding
        hb = engine.submit(engine.validate("second", {"max_new_tokens": 5}), b)
        assert b.wait_end().finish_reason is FinishReason.LENGTH
        assert a.wait_end().finish_reason is FinishReason.LENGTH
        mixed = [batch for batch in runner.batches if set(batch) == {ha.request_id, hb.request_id}]
        assert mixed, "b never shared a forward with a"
        # b left the batch as soon as it finished: a ran on alone afterwards.
        last_b = max(i for i, batch in enumerate(runner.batches) if hb.request_id in batch)
        assert runner.batches[last_b + 1] == [ha.request_id]
    finally:
        engine.shutdown()


def test_cancel_frees_blocks_and_others_continue(tokenizer, words):
    runner = FakeRunner(words, step_delay_s=0.002)
    engine = make_engine(tokenizer, runner)
    try:
        a, b = Collector(), Collector()
        ha = engine.submit(engine.validate("long one", {"max_new_tokens": 100}), a)
        engine.submit(engine.validate("other", {"max_new_tokens": 30}), b)
        a.events.get(timeout=TIMEOUT)
        ha.cancel()
        end = a.wait_end()
        assert isinstance(end, ErrorEvent) and isinstance(end.error, CancelledError)
        assert sum(isinstance(e, TokenEvent) for e in a.seen) < 100
        assert b.wait_end().finish_reason is FinishReason.LENGTH
        assert ha.request_id in runner.released
        stats = engine.stats()
        assert stats.kv_blocks_free == stats.kv_blocks_total and stats.running == 0
        a.assert_no_more()
    finally:
        engine.shutdown()


def test_cancel_while_queued(tokenizer, words):
    gate = threading.Event()

    class GatedRunner(FakeRunner):
        def execute(self, plan):
            gate.wait(TIMEOUT)
            return super().execute(plan)

    engine = make_engine(tokenizer, GatedRunner(words), max_batch_size=1)
    try:
        a, b = Collector(), Collector()
        engine.submit(engine.validate("first", {"max_new_tokens": 3}), a)
        hb = engine.submit(engine.validate("second", {"max_new_tokens": 3}), b)
        hb.cancel()
        gate.set()
        assert isinstance(b.wait_end().error, CancelledError)
        assert a.wait_end().finish_reason is FinishReason.LENGTH
        assert engine.stats().kv_blocks_free == engine.stats().kv_blocks_total
    finally:
        engine.shutdown()


def test_overloaded_past_max_concurrent_requests(tokenizer, words):
    gate = threading.Event()

    class GatedRunner(FakeRunner):
        def execute(self, plan):
            gate.wait(TIMEOUT)
            return super().execute(plan)

    engine = make_engine(tokenizer, GatedRunner(words), max_concurrent_requests=2)
    try:
        cs = [Collector(), Collector()]
        for c in cs:
            engine.submit(engine.validate("x", {"max_new_tokens": 2}), c)
        with pytest.raises(OverloadedError, match="Model is overloaded"):
            engine.submit(engine.validate("x", {"max_new_tokens": 2}), Collector())
        gate.set()
        for c in cs:
            assert isinstance(c.wait_end(), FinalEvent)
        c3 = Collector()  # capacity is back once they finished
        engine.submit(engine.validate("x", {"max_new_tokens": 2}), c3)
        assert isinstance(c3.wait_end(), FinalEvent)
    finally:
        engine.shutdown()


def test_forward_failure_ends_only_that_batch(tokenizer, words):
    poison = tokenizer("Z", add_special_tokens=False)["input_ids"][0]
    engine = make_engine(tokenizer, FakeRunner(words, poison=poison))
    try:
        bad = Collector()
        engine.submit(engine.validate([poison, 3, 4], {"max_new_tokens": 5}), bad)
        end = bad.wait_end()
        assert isinstance(end, ErrorEvent) and isinstance(end.error, GenerationError)
        assert "poisoned batch" in str(end.error)
        good = Collector()
        engine.submit(engine.validate("fine", {"max_new_tokens": 4}), good)
        assert isinstance(good.wait_end(), FinalEvent)
        assert engine.stats().kv_blocks_free == engine.stats().kv_blocks_total
    finally:
        engine.shutdown()


def test_a_result_with_an_error_ends_that_request_with_it_and_drops_its_token(tokenizer, words):
    """A grammar that cannot be followed mid-generation: the client gets an error, never a success with
    output the grammar does not allow; the others in the batch go on."""
    bad_start = tokenizer("Z", add_special_tokens=False)["input_ids"][0]
    engine = make_engine(tokenizer, FakeRunner(words, unfollowable=bad_start))
    try:
        bad, good = Collector(), Collector()
        engine.submit(engine.validate([bad_start, 3, 4], {"max_new_tokens": 8}), bad)
        engine.submit(engine.validate("fine", {"max_new_tokens": 6}), good)
        end = bad.wait_end()
        assert isinstance(end, ErrorEvent) and isinstance(end.error, ValidationError)
        assert "grammar cannot be followed" in str(end.error)
        assert [e.index for e in bad.seen if isinstance(e, TokenEvent)] == [0, 1]  # the failed step's token dropped
        final = good.wait_end()
        assert isinstance(final, FinalEvent) and final.generated_tokens == 6
        bad.assert_no_more()
        assert engine.stats().kv_blocks_free == engine.stats().kv_blocks_total
    finally:
        engine.shutdown()


def test_shutdown_ends_every_request_in_flight(tokenizer, words):
    engine = make_engine(tokenizer, FakeRunner(words, step_delay_s=0.005))
    cs = [Collector() for _ in range(3)]
    for c in cs:
        engine.submit(engine.validate("x", {"max_new_tokens": 120}), c)
    cs[0].events.get(timeout=TIMEOUT)
    engine.shutdown()
    for c in cs:
        end = c.wait_end()
        assert isinstance(end, ErrorEvent) and isinstance(end.error, ShutdownError)
        c.assert_no_more()
    with pytest.raises(ShutdownError):
        engine.submit(engine.validate("x"), Collector())


def test_details_carry_prefill_and_top_tokens(tokenizer, words):
    engine = make_engine(tokenizer, FakeRunner(words))
    try:
        c = Collector()
        req = engine.validate("Hello there", {"max_new_tokens": 3, "decoder_input_details": True,
                                              "top_n_tokens": 1, "details": True})
        engine.submit(req, c)
        final = c.wait_end()
        assert [p.id for p in final.prefill] == list(req.input_ids)
        assert final.prefill[0].logprob is None and all(p.logprob == -1.0 for p in final.prefill[1:])
        assert len(final.top_tokens) == 3 and all(len(t) == 1 for t in final.top_tokens)
    finally:
        engine.shutdown()


def test_return_full_text_prepends_prompt(tokenizer, words):
    engine = make_engine(tokenizer, FakeRunner(words))
    try:
        c = Collector()
        engine.submit(engine.validate("Hello", {"max_new_tokens": 2, "return_full_text": True}), c)
        final = c.wait_end()
        assert final.generated_text.startswith("Hello") and len(final.generated_text) > len("Hello")
    finally:
        engine.shutdown()


def test_last_token_is_flagged_and_gauges_drop_to_zero_when_idle(tokenizer, words):
    engine = make_engine(tokenizer, FakeRunner(words))
    try:
        c = Collector()
        engine.submit(engine.validate("Hello", {"max_new_tokens": 4}), c)
        c.wait_end()
        tokens = [e for e in c.seen if isinstance(e, TokenEvent)]
        assert [e.last for e in tokens] == [False, False, False, True]
        stats = engine.stats()
        assert stats.batch_size == 0 and stats.batch_max_tokens == 0
    finally:
        engine.shutdown()
