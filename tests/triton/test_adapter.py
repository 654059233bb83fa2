"""execute -> engine -> responder, with the real engine loop over a scripted runner (no model, no Triton).

Each test checks the invariant that every request gets exactly one final response (FakeApi raises on
anything sent after it), however it ends.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from tests.engine.fake_runner import FakeRunner
from tgi_llm.engine import Engine, LimitOptions
from tgi_llm.engine.limits import resolve_limits
from tgi_llm.triton.adapter import TritonAdapter
from tgi_llm.triton.metrics import TgiMetrics
from tgi_llm.triton.responder import Responder
from tgi_llm.triton.status import triton_code

from .fakes import FakeApi, FakeFamilies, FakeSender

WAIT = 30.0  # hang guard only


@dataclass
class FakeRequest:
    tensors: dict[str, np.ndarray]
    parameters: dict = field(default_factory=dict)
    sender: FakeSender = field(default_factory=FakeSender)


class FakeIO:
    def tensor(self, request: FakeRequest, name: str):
        return request.tensors.get(name)

    def parameters(self, request: FakeRequest) -> str:
        return json.dumps(request.parameters)

    def sender(self, request: FakeRequest) -> FakeSender:
        return request.sender


def request(prompt: str, stream: bool = False, **params) -> FakeRequest:
    tensors = {"text_input": np.array([prompt.encode()], dtype=np.object_), "stream": np.array([stream])}
    return FakeRequest(tensors, params)


@dataclass
class Harness:
    adapter: TritonAdapter
    engine: Engine
    api: FakeApi
    families: FakeFamilies

    def run(self, *requests: FakeRequest) -> list[FakeRequest]:
        self.adapter.execute(list(requests), FakeIO())
        for r in requests:
            assert r.sender.done.wait(WAIT), "no final response"
        return list(requests)


@pytest.fixture
def words(tokenizer):
    return tokenizer(" the quick brown fox jumps", add_special_tokens=False)["input_ids"]


@pytest.fixture
def make(tokenizer, words):
    built: list[TritonAdapter] = []

    def factory(runner: FakeRunner | None = None, **limit_kw) -> Harness:
        base = dict(max_input_tokens=64, max_total_tokens=128, max_batch_prefill_tokens=256,
                    max_batch_total_tokens=2048)
        limits = resolve_limits(LimitOptions(**(base | limit_kw)), max_position_embeddings=None, kv_cache_tokens=None)
        engine = Engine(tokenizer, limits, runner or FakeRunner(words), eos_token_ids={tokenizer.eos_token_id})
        api, families = FakeApi(), FakeFamilies()
        metrics = TgiMetrics(families, limits.max_input_tokens, limits.max_total_tokens)
        responder = Responder(api, metrics, engine.stats, engine.drain_step_stats, poll_interval_s=0.005)
        adapter = TritonAdapter(engine, responder)
        adapter.start()
        built.append(adapter)
        return Harness(adapter, engine, api, families)

    yield factory
    for adapter in built:
        adapter.finalize()


def test_streaming_sends_every_token_in_order_and_flags_the_last(make):
    h = make()
    (streamed,) = h.run(request("Hello", stream=True, max_new_tokens=6, details=True))
    (whole,) = h.run(request("Hello", max_new_tokens=6))
    responses = streamed.sender.responses
    # One response per batch of events the responder takes (a step's tokens, or more when it lags).
    assert sum(len(r.outputs["token_ids"]) for r in responses) == 6
    assert [r.final for r in responses] == [False] * (len(responses) - 1) + [True]
    assert all(r.error is None for r in responses)
    assert responses[-1].outputs["finish_reason"][0] == b"length"
    assert responses[-1].outputs["num_output_tokens"].tolist() == [6]
    assert streamed.sender.text() == whole.sender.text() != ""


def test_non_streaming_sends_exactly_one_response(make):
    h = make()
    (r,) = h.run(request("Hello", max_new_tokens=4, details=True))
    (only,) = r.sender.responses
    assert only.final and only.error is None
    assert only.outputs["token_ids"].shape == (4,)


def test_return_full_text_streams_the_prompt_first(make):
    h = make()
    (r,) = h.run(request("Hello", stream=True, max_new_tokens=3, return_full_text=True))
    (plain,) = h.run(request("Hello", max_new_tokens=3))
    assert r.sender.text() == "Hello" + plain.sender.text()


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"top_p": 1.5}, "top_p"),
        ({"max_new_tokens": 1000}, "max_new_tokens"),
        ({"max_new_tokens": "ten"}, "max_new_tokens"),
    ],
)
def test_invalid_request_gets_invalid_arg_and_never_reaches_the_engine(make, params, field):
    h = make()
    (r,) = h.run(request("Hello", **params))
    (only,) = r.sender.responses
    assert only.final and triton_code(only.error) == "INVALID_ARG"
    assert field in str(only.error)
    assert h.engine.stats().running == 0
    assert h.families.value("tgi_request_failure", err="validation") == 1


def test_a_request_that_asks_for_error_codes_gets_them_on_every_response(make):
    h = make()
    refused, served, plain = h.run(request("Hello", top_p=1.5, tgi_llm_error_code=True),
                                   request("Hello", stream=True, max_new_tokens=2, tgi_llm_error_code=True),
                                   request("Hello", top_p=1.5))
    assert [s.tagged for s in refused.sender.responses] == [True]
    assert served.sender.responses and all(s.tagged for s in served.sender.responses)
    assert [s.tagged for s in plain.sender.responses] == [False]
    assert served.sender.responses[-1].error is None and served.sender.text() != ""


def test_empty_prompt_is_invalid(make):
    (r,) = make().run(request(""))
    assert "`inputs` cannot be empty" in str(r.sender.responses[0].error)


def test_over_max_concurrent_requests_is_unavailable(make, words):
    h = make(FakeRunner(words, step_delay_s=0.01), max_concurrent_requests=1)
    long = request("Hello", stream=True, max_new_tokens=100)
    h.adapter.execute([long], FakeIO())
    (extra,) = h.run(request("Hello", max_new_tokens=2))
    (only,) = extra.sender.responses
    assert triton_code(only.error) == "UNAVAILABLE" and str(only.error) == "Model is overloaded"
    long.sender.cancelled = True
    assert long.sender.done.wait(WAIT)


def test_cancelled_request_frees_its_blocks_and_ends_with_one_error(make, words):
    h = make(FakeRunner(words, step_delay_s=0.01))
    r = request("Hello", stream=True, max_new_tokens=120)
    h.adapter.execute([r], FakeIO())
    while len(r.sender.responses) < 2:
        time.sleep(0.005)
    r.sender.cancelled = True
    assert r.sender.done.wait(WAIT)
    final = r.sender.finals[0]
    assert triton_code(final.error) == "CANCELLED"
    assert len(r.sender.responses) < 120
    stats = h.engine.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total
    assert h.families.value("tgi_request_failure", err="cancelled") == 1


def test_generation_failure_ends_only_the_affected_request(make, words, tokenizer):
    poison = tokenizer("Boom", add_special_tokens=False)["input_ids"][0]
    h = make(FakeRunner(words, poison=poison))
    bad, good = h.run(request("Boom", max_new_tokens=3))[0], h.run(request("Hello", max_new_tokens=3))[0]
    assert triton_code(bad.sender.responses[0].error) == "INTERNAL"
    assert good.sender.responses[0].error is None


def test_finalize_ends_requests_in_flight_with_an_error(make, words):
    h = make(FakeRunner(words, step_delay_s=0.01))
    inflight = [request("Hello", stream=True, max_new_tokens=120) for _ in range(3)]
    h.adapter.execute(inflight, FakeIO())
    while not all(r.sender.responses for r in inflight):
        time.sleep(0.005)
    h.adapter.finalize()
    for r in inflight:
        assert len(r.sender.finals) == 1
        assert triton_code(r.sender.finals[0].error) == "UNAVAILABLE"


def test_metrics_count_the_traffic(make):
    h = make()
    h.run(request("Hello", max_new_tokens=3), request("Hi", stream=True, max_new_tokens=2), request("x", top_k=-1))
    h.adapter.responder.stop()  # flush: metrics are recorded after the responses go out
    f = h.families
    assert f.value("tgi_request_count") == 3
    assert f.value("tgi_request_success") == 2
    assert f.value("tgi_request_failure", err="validation") == 1
    assert sorted(f.observations("tgi_request_generated_tokens")) == [2.0, 3.0]
    assert f.value("tgi_batch_inference_count", method="prefill") >= 1
    assert f.value("tgi_kv_blocks_free") == h.engine.stats().kv_blocks_total


def test_execute_returns_before_a_slow_tokenization_and_others_are_served_meanwhile(make):
    h = make()
    slow_started, release = threading.Event(), threading.Event()
    validate = h.engine.validate

    def slow_validate(inputs, params=None, stream=False):
        if inputs == "slow":
            slow_started.set()
            assert release.wait(WAIT)
        return validate(inputs, params, stream=stream)

    h.engine.validate = slow_validate
    slow = request("slow", max_new_tokens=2)
    h.adapter.execute([slow], FakeIO())  # returns at once: tokenizing happens on a worker
    assert slow_started.wait(WAIT) and not slow.sender.done.is_set()
    (fast,) = h.run(request("Hello", max_new_tokens=2))  # the other worker serves it meanwhile
    assert fast.sender.finals[0].error is None and not slow.sender.done.is_set()
    release.set()
    assert slow.sender.done.wait(WAIT) and slow.sender.finals[0].error is None
