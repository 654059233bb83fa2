"""--api-key, and huggingface_hub's InferenceClient against the front over a fake Triton client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.front.conftest import MODEL_ID, LiveServer, serve_in_thread
from tests.front.fake_client import FakeTritonClient
from tgi_llm.front.app import create_app
from tgi_llm.front.config import FrontConfig

KEY = "s3cret-key"


@pytest.fixture
def keyed(fake: FakeTritonClient, front_tokenizer: Any) -> Iterator[str]:
    app = create_app(FrontConfig(model_id=MODEL_ID, api_key=KEY), fake, front_tokenizer)
    yield from serve_in_thread(app)


def test_api_key_guards_generation_routes_only(keyed: str, fake: FakeTritonClient) -> None:
    body = {"inputs": "hi", "parameters": {"max_new_tokens": 1}}
    for route in ("/generate", "/generate_stream", "/", "/v1/completions", "/v1/chat/completions"):
        r = httpx.post(keyed + route, json=body)
        assert r.status_code == 401, route
    assert httpx.post(keyed + "/generate", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(keyed + "/info").status_code == 401
    assert fake.specs == []  # nothing reached Triton
    r = httpx.post(keyed + "/generate", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json() == {"generated_text": " w0"}
    for route in ("/health", "/metrics", "/ping"):
        assert httpx.get(keyed + route).status_code == 200, route


def test_openai_sdk_with_api_key(keyed: str) -> None:
    openai = pytest.importorskip("openai")
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed + "/v1", api_key="nope", max_retries=0).chat.completions.create(
            model="m", messages=messages
        )
    good = openai.OpenAI(base_url=keyed + "/v1", api_key=KEY, max_retries=0)
    reply = good.chat.completions.create(model="m", messages=messages, max_tokens=1, temperature=0)
    assert reply.choices[0].message.content == " w0"


def test_hf_inference_client_text_generation(live: LiveServer) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=live.url)
    out = client.text_generation("a b", max_new_tokens=3, details=True)
    assert out.generated_text == " w0 w1 w2"
    assert out.details.finish_reason == "length" and out.details.generated_tokens == 3
    assert [t.id for t in out.details.tokens] == [100, 101, 102]
    events = list(client.text_generation("a b", max_new_tokens=3, details=True, stream=True))
    assert [e.token.id for e in events] == [100, 101, 102]
    assert events[-1].generated_text == " w0 w1 w2"
    assert events[-1].details.finish_reason == "length" and events[-1].details.generated_tokens == 3
    assert "".join(client.text_generation("a b", max_new_tokens=2, stream=True)) == " w0 w1"
    assert client.text_generation("a b", max_new_tokens=2) == " w0 w1"


def test_hf_inference_client_sees_tgi_errors(live: LiveServer) -> None:
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import OverloadedError, ValidationError

    client = InferenceClient(model=live.url)
    with pytest.raises(ValidationError, match="`temperature` must be strictly positive"):
        client.text_generation("a", temperature=-1.0)
    with pytest.raises(OverloadedError):
        list(client.text_generation("overload", stream=True, details=True))
