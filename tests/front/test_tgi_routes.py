"""TGI's routes over a fake Triton client: request/response shapes, SSE events, status codes."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from tests.front.fake_client import FakeTritonClient


def sse_events(body: str) -> list[dict]:
    return [json.loads(line[len("data:"):]) for line in body.splitlines() if line.startswith("data:")]


def test_generate_plain_has_no_details(client: TestClient, fake: FakeTritonClient) -> None:
    r = client.post("/generate", json={"inputs": "hello", "parameters": {"max_new_tokens": 3}})
    assert r.status_code == 200
    assert r.json() == {"generated_text": " w0 w1 w2"}
    assert r.headers["x-generated-tokens"] == "3"
    spec = fake.specs[-1]
    assert spec.parameters["max_new_tokens"] == 3 and not spec.stream
    assert "return_full_text" not in spec.parameters  # the front prepends the prompt itself


def test_generate_details_shape(client: TestClient) -> None:
    params = {"max_new_tokens": 2, "details": True, "decoder_input_details": True, "top_n_tokens": 2,
              "do_sample": True, "seed": 42}
    body = client.post("/generate", json={"inputs": "hello", "parameters": params}).json()
    details = body["details"]
    assert details["finish_reason"] == "length"
    assert details["generated_tokens"] == 2
    assert details["seed"] == 42
    assert details["prefill"] == [{"id": 1, "text": "<s>", "logprob": None}, {"id": 2, "text": "hi", "logprob": -1.5}]
    assert [t["id"] for t in details["tokens"]] == [100, 101]
    assert set(details["tokens"][0]) == {"id", "text", "logprob", "special"}
    assert [[t["id"] for t in top] for top in details["top_tokens"]] == [[100, 7], [101, 7]]


def test_generate_details_leaves_out_prefill_and_top_tokens_unless_asked(client: TestClient) -> None:
    details = client.post("/generate", json={"inputs": "hi", "parameters": {"details": True}}).json()["details"]
    assert details["prefill"] == []
    assert "top_tokens" not in details
    assert details["seed"] is None  # greedy: no seed, as TGI


def test_return_full_text_prepends_prompt(client: TestClient) -> None:
    r = client.post("/generate", json={"inputs": "Say:", "parameters": {"max_new_tokens": 1, "return_full_text": True}})
    assert r.json()["generated_text"] == "Say: w0"


def test_compat_route_returns_a_list_or_a_stream(client: TestClient) -> None:
    r = client.post("/", json={"inputs": "hi", "parameters": {"max_new_tokens": 2}})
    assert r.json() == [{"generated_text": " w0 w1"}]
    r = client.post("/", json={"inputs": "hi", "parameters": {"max_new_tokens": 2}, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    assert [e["token"]["text"] for e in sse_events(r.text)] == [" w0", " w1"]


def test_generate_stream_events(client: TestClient, fake: FakeTritonClient) -> None:
    r = client.post("/generate_stream", json={"inputs": "a b c", "parameters": {"max_new_tokens": 3, "details": True}})
    assert r.status_code == 200
    assert all(line.startswith("data: {") for line in r.text.splitlines() if line)  # one space, as strict parsers want
    events = sse_events(r.text)
    assert [e["index"] for e in events] == [1, 2, 3]
    assert [e["token"]["id"] for e in events] == [100, 101, 102]
    assert all(e["generated_text"] is None and e["details"] is None for e in events[:-1])
    assert events[-1]["generated_text"] == " w0 w1 w2"
    assert events[-1]["details"] == {"finish_reason": "length", "generated_tokens": 3, "seed": None, "input_length": 3,
                                     "cached_tokens": 0, "accepted_draft_tokens": 0}
    assert fake.specs[-1].stream


def test_generate_stream_without_details_still_ends_with_text(client: TestClient) -> None:
    events = sse_events(client.post("/generate_stream", json={"inputs": "eos"}).text)
    assert events[-1]["generated_text"] == " w0 w1 w2"
    assert events[-1]["details"] is None


def test_validation_error_is_422_with_tgi_body(client: TestClient) -> None:
    for route in ("/generate", "/generate_stream"):
        r = client.post(route, json={"inputs": "hi", "parameters": {"temperature": -1.0}})
        assert r.status_code == 422
        assert r.json() == {"error": "`temperature` must be strictly positive", "error_type": "validation"}


def test_malformed_bodies_are_422(client: TestClient) -> None:
    r = client.post("/generate", json={"parameters": {}})
    assert r.status_code == 422
    assert r.json()["error_type"] == "validation" and "inputs" in r.json()["error"]
    assert client.post("/generate", content=b"{not json").status_code == 422
    r = client.post("/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": "many"}})
    assert r.status_code == 422 and "max_new_tokens" in r.json()["error"]


def test_form_encoded_curl_body_is_read_as_json(client: TestClient) -> None:
    r = client.post("/generate", content=b'{"inputs":"hi","parameters":{"max_new_tokens":1}}',
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json() == {"generated_text": " w0"}


def test_overloaded_is_429(client: TestClient) -> None:
    r = client.post("/generate", json={"inputs": "overload"})
    assert r.status_code == 429
    assert r.json() == {"error": "Model is overloaded", "error_type": "overloaded"}


def test_generation_error_mid_stream_is_an_error_event(client: TestClient) -> None:
    r = client.post("/generate_stream", json={"inputs": "boom"})
    events = sse_events(r.text)
    assert [e["token"]["text"] for e in events[:-1]] == [" w0", " w1"]
    assert events[-1] == {"error": "Request failed during generation: boom", "error_type": "generation"}
    r = client.post("/generate", json={"inputs": "boom"})
    assert r.status_code == 424 and r.json()["error_type"] == "generation"


def test_tokenize_returns_offsets(client: TestClient) -> None:
    tokens = client.post("/tokenize", json={"inputs": "Hello world"}).json()
    assert "".join(t["text"] for t in tokens) == "Hello world"
    assert all("Hello world"[t["start"]:t["stop"]] == t["text"] for t in tokens)
    assert all(isinstance(t["id"], int) for t in tokens)


def test_info_health_metrics(client: TestClient, fake: FakeTritonClient) -> None:
    info = client.get("/info").json()
    assert info["model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert {"max_input_tokens", "max_total_tokens", "max_concurrent_requests", "version"} <= set(info)
    assert info["model_family"] is None  # the launcher names it (--model-family); this app was given none
    assert client.get("/health").status_code == 200
    assert "tgi_request_count 3" in client.get("/metrics").text
    fake.healthy = False
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["error_type"] == "healthcheck"


def test_stream_end_sent_after_the_last_token_still_lands_on_it(client: TestClient, fake: FakeTritonClient) -> None:
    """Triton may send finish reason and counts in a token-less final response: the last token's event
    must carry them all the same (held back when it is probably the last: EOS, max_new_tokens, stop)."""
    fake.final_alone = True
    cases = [
        ({"inputs": "a", "parameters": {"max_new_tokens": 2, "details": True}}, "length", 2),
        ({"inputs": "eos", "parameters": {"details": True}}, "eos_token", 3),
        ({"inputs": "a", "parameters": {"stop": ["w1"], "details": True}}, "stop_sequence", 2),
    ]
    for body, reason, n in cases:
        events = sse_events(client.post("/generate_stream", json=body).text)
        assert [e["index"] for e in events] == list(range(1, n + 1))
        assert events[-1]["details"]["finish_reason"] == reason
        assert events[-1]["details"]["generated_tokens"] == n
        assert events[-1]["generated_text"] == "".join(f" w{i}" for i in range(n))
        assert all(e["details"] is None for e in events[:-1])


def test_best_of_draws_that_many_sequences_and_returns_the_most_likely(client: TestClient,
                                                                        fake: FakeTritonClient) -> None:
    body = {"inputs": "a b", "parameters": {"best_of": 2, "do_sample": True, "details": True, "max_new_tokens": 2}}
    r = client.post("/generate", json=body)
    assert r.status_code == 200
    details = r.json()["details"]
    assert len(details["best_of_sequences"]) == 1
    assert all("best_of" not in s.parameters for s in fake.specs[-2:])
    for params, message in (({"best_of": 2}, "you must use sampling when `best_of` is > 1"),
                            ({"best_of": 2, "do_sample": True, "seed": 1}, "`seed` must not be set when `best_of` > 1"),
                            ({"best_of": 3, "do_sample": True}, "`best_of` must be > 0 and <= 2. Given: 3")):
        r = client.post("/generate", json={"inputs": "a", "parameters": params})
        assert (r.status_code, r.json()["error"]) == (422, message)
    r = client.post("/generate_stream", json={"inputs": "a", "parameters": {"best_of": 2, "do_sample": True}})
    assert r.json()["error"] == "`best_of` != 1 is not supported when streaming tokens"
