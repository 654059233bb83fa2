"""tritonserver serving the engine: gRPC streaming, HTTP generate, concurrency, cancellation, errors, metrics."""

from __future__ import annotations

import http.client
import json
import threading

import numpy as np
import pytest

from .conftest import MAX_CONCURRENT_REQUESTS
from .harness import (
    Launched,
    OpenStream,
    grpc_generate,
    http_generate,
    http_generate_stream,
    metric,
    read_metrics,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "What is deep learning?"


def kv_settled(server: Launched) -> bool:
    """Every block free and nothing queued or running. The engine gauges are sampled every 100 ms, so a
    short request can start and end between two samples: wait for all of them, not one."""
    snap = read_metrics(server)
    total = metric(snap, "tgi_kv_blocks_total")
    return total > 0 and metric(snap, "tgi_kv_blocks_free") == total \
        and metric(snap, "tgi_queue_size") == 0 and metric(snap, "tgi_batch_current_size") == 0


def test_grpc_stream_sends_token_deltas_that_add_up_to_the_greedy_text(server, reference):
    seen_success = []

    def on_response(reply):
        if len(reply.texts) == 1:  # when the first response arrives, the request has not finished yet
            seen_success.append(metric(read_metrics(server), "tgi_request_success"))
        return False

    before = metric(read_metrics(server), "tgi_request_success")
    reply = grpc_generate(server, PROMPT, max_tokens=24, on_response=on_response)
    assert reply.error is None
    assert len(reply.texts) > 1
    assert reply.finals[-1] is True and not any(reply.finals[:-1])
    assert seen_success == [before]
    assert reply.text == reference(PROMPT, 24)
    assert len(reply.texts) == reply.num_output_tokens  # one response per token
    assert reply.finish_reason in ("length", "eos_token")


def test_http_generate_returns_one_json_response(server, reference):
    status, body = http_generate(server, {"text_input": PROMPT, "max_tokens": 16})
    assert status == 200
    assert body["text_output"] == reference(PROMPT, 16)
    assert body["finish_reason"] in ("length", "eos_token")
    assert body["num_input_tokens"] > 0


def test_http_generate_stream_sends_server_sent_events(server, reference):
    events = http_generate_stream(server, {"text_input": PROMPT, "max_tokens": 16, "stream": True})
    assert len(events) > 1
    assert "".join(e["text_output"] for e in events) == reference(PROMPT, 16)
    assert "finish_reason" in events[-1] and all("finish_reason" not in e for e in events[:-1])


def test_tgi_parameters_as_request_parameters(server):
    status, body = http_generate(server, {"text_input": PROMPT, "max_new_tokens": 3, "details": True,
                                          "decoder_input_details": True, "top_n_tokens": 2})
    assert status == 200
    assert body["num_output_tokens"] == 3
    assert len(body["token_ids"]) == 3
    assert len(body["top_token_ids"]) == 3 * 2  # [tokens, n], flattened by the generate extension
    assert len(body["prefill_token_ids"]) == body["num_input_tokens"]


def test_32_concurrent_streams_each_get_the_text_they_get_alone(server):
    prompts = ["Tell me a story", "What is the capital of France?", "Write a haiku about the sea", "2 + 2 ="]
    alone = {p: grpc_generate(server, p, max_tokens=16).text for p in prompts}
    results: list = [None] * 32

    def client(i: int) -> None:
        results[i] = grpc_generate(server, prompts[i % len(prompts)], max_tokens=16)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, reply in enumerate(results):
        assert reply.error is None, reply.error
        assert reply.finals[-1] is True
        assert reply.text == alone[prompts[i % len(prompts)]], f"client {i}"


def test_grpc_cancel_mid_stream_frees_kv_blocks_and_server_keeps_serving(server):
    before = read_metrics(server)
    reply = grpc_generate(server, PROMPT, max_tokens=400, ignore_eos=True, on_response=lambda r: len(r.texts) == 3)
    assert len(reply.texts) == 3 and not any(reply.finals)
    assert wait_until(lambda: metric(read_metrics(server), "tgi_request_failure", err="cancelled")
                      == metric(before, "tgi_request_failure", err="cancelled") + 1)
    assert wait_until(lambda: kv_settled(server))
    after = read_metrics(server)
    assert metric(after, "tgi_request_success") == metric(before, "tgi_request_success")
    assert grpc_generate(server, "Hello", max_tokens=4).finals[-1] is True


def test_http_client_disconnect_cancels_generation(server):
    before = metric(read_metrics(server), "tgi_request_failure", err="cancelled")
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=300)
    body = json.dumps({"text_input": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True})
    conn.request("POST", "/v2/models/tgi_llm/generate_stream", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    events = 0
    while events < 2:
        if response.fp.readline().startswith(b"data:"):
            events += 1
    conn.close()  # the client goes away mid-stream
    assert wait_until(lambda: metric(read_metrics(server), "tgi_request_failure", err="cancelled") == before + 1)
    assert wait_until(lambda: kv_settled(server))
    assert http_generate(server, {"text_input": "Hello", "max_tokens": 2})[0] == 200


INVALID = "StatusCode.INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("tensors", "parameters", "field", "code"),
    [
        ({"text_input_override": ""}, None, "inputs", INVALID),
        ({"top_p": 1.5}, None, "top_p", INVALID),
        ({"max_tokens": 5000}, None, "max_new_tokens", INVALID),
        ({"text_input_override": "word " * 600}, None, "inputs", INVALID),  # prompt over max_input_tokens
        ({}, {"max_new_tokens": "ten"}, "max_new_tokens", INVALID),  # wrong parameter type
        # Wrong tensor type: Triton itself rejects it before the model and reports it in-band without a
        # status code (even with `triton_grpc_error`); the gateway gives it one.
        ({"max_tokens": 4, "top_k": np.array([2.0], dtype=np.float32)}, None, "top_k", INVALID),
    ],
)
def test_invalid_requests_get_invalid_arg_naming_the_field(server, tensors, parameters, field, code):
    tensors = dict(tensors)
    prompt = tensors.pop("text_input_override", PROMPT)
    reply = grpc_generate(server, prompt, parameters=parameters, **tensors)
    assert reply.error is not None and not reply.texts
    assert reply.error.status() == code
    assert field in reply.error.message()
    assert grpc_generate(server, "Hello", max_tokens=2).finals[-1] is True  # still serving


def test_without_the_status_header_the_error_arrives_in_the_stream_as_the_model_worded_it(server):
    """The gateway asks the model for its errors' codes (a tag in the message) and takes the tag off again."""
    reply = grpc_generate(server, PROMPT, status_header=False, top_p=1.5)
    assert reply.error is not None and not reply.texts
    assert reply.error.message().endswith("`top_p` must be > 0.0 and < 1.0")
    assert "[tgi_llm" not in reply.error.message()
    assert grpc_generate(server, "Hello", status_header=False, max_tokens=2).finals[-1] is True


def test_over_max_concurrent_requests_is_unavailable_and_overloaded(server):
    before = read_metrics(server)
    # Long enough (1000 tokens) that none can finish while the test runs.
    streams = [OpenStream(server, f"Count to {i}", max_tokens=1000, ignore_eos=True)
               for i in range(MAX_CONCURRENT_REQUESTS)]
    try:
        # All of them submitted (queued or running: both count against the limit).
        assert wait_until(lambda: metric(read_metrics(server), "tgi_request_count")
                          == metric(before, "tgi_request_count") + MAX_CONCURRENT_REQUESTS)
        reply = grpc_generate(server, PROMPT, max_tokens=2)
        assert reply.error is not None
        assert reply.error.status() == "StatusCode.UNAVAILABLE"
        assert reply.error.message() == "Model is overloaded"
        assert http_generate(server, {"text_input": PROMPT, "max_tokens": 2}) == (429, {"error": "Model is overloaded"})
    finally:
        for s in streams:
            s.cancel()
    assert wait_until(lambda: kv_settled(server))
    overloaded = metric(read_metrics(server), "tgi_request_failure", err="overloaded")
    assert overloaded == metric(before, "tgi_request_failure", err="overloaded") + 2
    assert grpc_generate(server, "Hello", max_tokens=2).finals[-1] is True


def test_http_invalid_request_is_a_400_with_tgi_message(server):
    status, body = http_generate(server, {"text_input": PROMPT, "top_p": 1.5})
    assert status == 400
    assert body["error"] == "`top_p` must be > 0.0 and < 1.0"


def test_metrics_count_the_traffic_sent(server):
    before = read_metrics(server)
    generated = []
    for n in (2, 3, 4):
        status, body = http_generate(server, {"text_input": PROMPT, "max_tokens": n})
        assert status == 200
        generated.append(body["num_output_tokens"])
    streamed = grpc_generate(server, PROMPT, max_tokens=5)
    generated.append(streamed.num_output_tokens)
    for body in ({"text_input": ""}, {"text_input": PROMPT, "top_p": 1.5}):
        assert http_generate(server, body)[0] == 400

    def delta(name: str, **labels: str) -> float:
        return metric(read_metrics(server), name, **labels) - metric(before, name, **labels)

    # Metrics are recorded on the responder thread right after each response: wait for them to land.
    assert wait_until(lambda: delta("tgi_request_count") == 6 and delta("tgi_request_success") == 4
                      and delta("tgi_request_failure", err="validation") == 2)
    assert delta("tgi_request_generated_tokens_sum") == sum(generated)
    assert delta("tgi_request_input_length_count") == 4
    assert delta("tgi_request_duration_count") == 4
    assert delta("tgi_request_queue_duration_count") == 4
    assert delta("tgi_request_inference_duration_count") == 4
    assert delta("tgi_request_mean_time_per_token_duration_count") == 4
    assert delta("tgi_batch_inference_count", method="prefill") >= 1
    assert delta("tgi_batch_inference_count", method="decode") >= 1
    assert delta("tgi_batch_forward_duration_count", method="decode") >= 1
    assert wait_until(lambda: kv_settled(server))
    snap = read_metrics(server)
    assert metric(snap, "tgi_kv_blocks_used") == 0
    assert metric(snap, "tgi_queue_size") == 0
    for name in ("tgi_batch_current_size", "tgi_batch_current_max_tokens"):
        assert (name, frozenset()) in snap


def test_a_repeated_prompt_is_served_from_the_prefix_cache_and_counted(server, reference):
    prompt = "Summarize the following: " + "the quick brown fox jumps over the lazy dog. " * 12
    before = read_metrics(server)
    first = grpc_generate(server, prompt, max_tokens=8)
    second = grpc_generate(server, prompt, max_tokens=8)
    assert first.error is None and second.error is None
    assert first.text == second.text == reference(prompt, 8)
    assert second.num_cached_tokens >= 96 and second.num_cached_tokens % 16 == 0

    def gained(name: str, snapshot: dict) -> float:
        return metric(snapshot, name) - metric(before, name)

    hits = second.num_cached_tokens + first.num_cached_tokens  # the metrics follow within a poll interval
    assert wait_until(lambda: gained("vllm:prefix_cache_hits", read_metrics(server)) >= hits, 10)
    after = read_metrics(server)
    assert gained("vllm:prefix_cache_queries", after) > gained("vllm:prefix_cache_hits", after)
    assert 0 <= metric(after, "vllm:kv_cache_usage_perc") <= 1
    # --max-batch-total-tokens 16384: a pool of 1024 blocks of 16 tokens
    assert metric(after, "vllm:cache_config_info", block_size="16", num_gpu_blocks="1024") == 1
    assert wait_until(lambda: kv_settled(server))


def test_grammars_through_triton_tensors_and_request_parameters(server):
    import re

    reply = grpc_generate(server, "The year:", max_tokens=12, guided_decoding_guide_type="regex",
                          guided_decoding_guide="(19|20)[0-9]{2}")
    assert reply.error is None and re.fullmatch(r"(19|20)[0-9]{2}", reply.text)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    reply = grpc_generate(server, "JSON:", stream=False, max_tokens=20, guided_decoding_guide_type="json_schema",
                          guided_decoding_guide=json.dumps(schema))
    assert reply.error is None and isinstance(json.loads(reply.text)["ok"], bool)
    grammar = json.dumps({"type": "regex", "value": "(yes|no)"})  # TGI's grammar, as a request parameter
    status, body = http_generate(server, {"text_input": "Answer:", "max_tokens": 5, "grammar": grammar})
    assert status == 200 and body["text_output"] in ("yes", "no")
    reply = grpc_generate(server, "x", max_tokens=5, guided_decoding_guide_type="regex", guided_decoding_guide="[a-")
    assert reply.error is not None and "`grammar` cannot be compiled" in str(reply.error)


def test_genai_perf_request_bodies_for_its_vllm_and_tensorrtllm_backends(server):
    """The inputs genai-perf sends with --output-tokens-mean-deterministic: vLLM's sampling_parameters with
    numbers written as strings, TensorRT-LLM's min_length; both get exactly the asked number of tokens."""
    vllm = json.dumps({"max_tokens": "24", "min_tokens": "24", "ignore_eos": "true", "temperature": "0.5"})
    reply = grpc_generate(server, PROMPT, sampling_parameters=vllm, exclude_input_in_output=True,
                          return_num_input_tokens=True, return_num_output_tokens=True)
    assert reply.error is None and reply.num_output_tokens == 24
    reply = grpc_generate(server, "Hi", max_tokens=20, min_length=20)
    assert reply.error is None and reply.num_output_tokens == 20
