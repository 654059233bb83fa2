"""The front over the real default model (in-process engine, no tritonserver): the official openai SDK and
huggingface_hub's InferenceClient get the model's own greedy text, right usage counts, and a stream closed
early gives its KV blocks back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.front.conftest import serve_in_thread
from tests.front.engine_client import EngineClient
from tgi_llm.front.app import create_app
from tgi_llm.front.config import FrontConfig

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
NEW = 12


@pytest.fixture(scope="module")
def llm(default_model_dir: Path) -> Iterator[Any]:
    from tgi_llm import LLM

    with LLM(str(default_model_dir), max_total_tokens=512, max_batch_total_tokens=2048) as engine:
        yield engine


@pytest.fixture(scope="module")
def engine_client(llm: Any) -> EngineClient:
    return EngineClient(llm)


@pytest.fixture(scope="module")
def url(engine_client: EngineClient, front_tokenizer: Any) -> Iterator[str]:
    app = create_app(FrontConfig(model_id="SmolLM2-135M-Instruct"), engine_client, front_tokenizer)
    yield from serve_in_thread(app)


def test_openai_chat_is_the_models_greedy_text(url: str, llm: Any, front_tokenizer: Any) -> None:
    prompt = front_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    direct = llm.generate([prompt], {"max_new_tokens": NEW})[0]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0)

    reply = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=NEW, temperature=0)
    assert reply.choices[0].message.content == direct.text
    assert reply.usage.prompt_tokens == len(front_tokenizer(prompt)["input_ids"])
    assert reply.usage.completion_tokens == direct.generated_tokens
    assert reply.choices[0].finish_reason == {"length": "length"}.get(direct.finish_reason, "stop")

    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=NEW, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == direct.text
    assert chunks[-1].usage.completion_tokens == direct.generated_tokens
    assert chunks[-1].usage.prompt_tokens == reply.usage.prompt_tokens


def test_hf_inference_client_stream_matches_non_stream(url: str) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=url)
    whole = client.text_generation("The three primary colors are", max_new_tokens=NEW, details=True)
    events = list(client.text_generation("The three primary colors are", max_new_tokens=NEW, details=True,
                                         stream=True))
    assert [e.token.id for e in events] == [t.id for t in whole.details.tokens]
    assert "".join(e.token.text for e in events) == whole.generated_text == events[-1].generated_text
    assert events[-1].details.finish_reason == whole.details.finish_reason
    assert events[-1].details.generated_tokens == whole.details.generated_tokens == len(events)


def test_validation_message_is_tgis(url: str) -> None:
    r = httpx.post(f"{url}/generate", json={"inputs": "hi", "parameters": {"top_n_tokens": 50}})
    assert r.status_code == 422
    assert r.json() == {"error": "`top_n_tokens` must be >= 0 and <= 5. Given: 50", "error_type": "validation"}


def test_closed_stream_frees_its_blocks(url: str, llm: Any, engine_client: EngineClient, front_tokenizer: Any) -> None:
    story = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]
    prompt = front_tokenizer.apply_chat_template(story, tokenize=False, add_generation_prompt=True)
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 400}}
    with httpx.Client(base_url=url, timeout=120) as http, http.stream("POST", "/generate_stream", json=body) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data:"))
        next(lines), next(lines)
        assert llm.engine.stats().kv_blocks_used > 0  # it is generating
    deadline = time.monotonic() + 120
    while llm.engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine_client.ended[-1] == "cancelled"  # ended by the disconnect, not by running to its end
    stats = llm.engine.stats()
    assert stats.running == 0
    assert stats.kv_blocks_free == stats.kv_blocks_total
