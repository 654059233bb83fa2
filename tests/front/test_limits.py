"""Bounded requests at the front: --payload-limit, JSON depth, the number of stop sequences."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.front.fake_client import FakeTritonClient
from tgi_llm.front.app import create_app
from tgi_llm.front.config import FrontConfig, InfoLimits


def test_a_body_over_the_payload_limit_is_413_and_reaches_nothing(front_tokenizer) -> None:
    fake = FakeTritonClient()
    app = create_app(FrontConfig(payload_limit=1000), fake, front_tokenizer)
    with TestClient(app) as client:
        r = client.post("/generate", json={"inputs": "x" * 2000})
        assert r.status_code == 413
        assert r.json()["error"] == "Payload too large: the request body must be at most 1000 bytes (--payload-limit)"
        assert client.post("/generate", json={"inputs": "x" * 100}).status_code == 200
    assert len(fake.specs) == 1


def test_deeply_nested_json_is_a_422_not_a_500(client: TestClient) -> None:
    deep = '{"inputs": "hi", "parameters": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = client.post("/generate", content=deep, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json() == {"error": "Failed to parse the request body as JSON: JSON body nested deeper than 64 levels",
                        "error_type": "validation"}


def test_too_many_stop_sequences_are_refused_before_reaching_triton(front_tokenizer) -> None:
    fake = FakeTritonClient()
    app = create_app(FrontConfig(limits=InfoLimits(max_stop_sequences=2)), fake, front_tokenizer)
    with TestClient(app) as client:
        body = {"inputs": "hi", "parameters": {"stop": ["a"] * 100_000}}
        r = client.post("/generate", json=body)
        assert r.status_code == 422
        assert r.json()["error"] == "`stop` supports up to 2 stop sequences. Given: 100000"
        chat = {"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c"]}
        assert client.post("/v1/chat/completions", json=chat).status_code == 400  # OpenAI's status
        r = client.post("/v1/completions", json={"prompt": "hi", "stop": ["a", "b", "c"]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    assert fake.specs == []
