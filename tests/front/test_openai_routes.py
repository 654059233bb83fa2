"""OpenAI's routes, driven by the official openai SDK against the front served over a fake Triton client."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.front.conftest import MODEL_ID, LiveServer
from tests.front.fake_client import FakeTritonClient
from tgi_llm.front.app import create_app
from tgi_llm.front.config import FrontConfig

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


def sdk(live: LiveServer) -> Any:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)


def test_chat_greedy_non_stream(live: LiveServer, front_tokenizer: Any) -> None:
    reply = sdk(live).chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=3, temperature=0)
    assert reply.choices[0].message.content == " w0 w1 w2"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "length"
    spec = live.fake.specs[-1]
    # The model's own chat template rendered the prompt, ending with the assistant turn's opening.
    assert spec.inputs == front_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert spec.inputs.endswith("<|im_start|>assistant\n")
    assert spec.parameters["do_sample"] is False and "temperature" not in spec.parameters  # 0 means greedy
    assert reply.usage.prompt_tokens == len(spec.inputs.split())
    assert reply.usage.completion_tokens == 3 and reply.usage.total_tokens == reply.usage.prompt_tokens + 3


def test_chat_stream_matches_non_stream_and_reports_usage(live: LiveServer) -> None:
    client = sdk(live)
    stream = client.chat.completions.create(
        model="tgi", messages=MESSAGES, max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " w0 w1 w2 w3"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert len({c.id for c in chunks}) == 1


def test_chat_sampling_parameters_map_to_tgi(live: LiveServer) -> None:
    sdk(live).chat.completions.create(
        model="tgi", messages=MESSAGES, max_tokens=2, temperature=0.7, top_p=0.9, seed=7, stop=["w1"],
        frequency_penalty=0.5, presence_penalty=0.25,
    )
    params = live.fake.specs[-1].parameters
    assert params["do_sample"] is True and params["temperature"] == 0.7 and params["top_p"] == 0.9
    assert params["seed"] == 7 and params["stop"] == ["w1"] and params["max_new_tokens"] == 2
    assert params["frequency_penalty"] == 0.5 and params["presence_penalty"] == 0.25


def test_vllms_extensions_map_to_tgi(live: LiveServer) -> None:
    sdk(live).chat.completions.create(
        model="tgi", messages=MESSAGES, max_completion_tokens=6, temperature=0,
        extra_body={"top_k": 5, "min_tokens": 4, "ignore_eos": True, "speculate": 0},
    )
    params = live.fake.specs[-1].parameters
    assert params["top_k"] == 5 and params["min_new_tokens"] == 4 and params["max_new_tokens"] == 6
    assert params["ignore_eos"] is True and params["speculate"] == 0
    sdk(live).completions.create(model="tgi", prompt="a", max_tokens=2, extra_body={"top_k": -1})
    assert "top_k" not in live.fake.specs[-1].parameters  # vLLM's "every token"


@pytest.mark.parametrize("min_tokens", [-1, 9])
def test_min_tokens_out_of_range_is_400_naming_it(client: TestClient, fake: FakeTritonClient, min_tokens) -> None:
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 8, "min_tokens": min_tokens})
    assert r.status_code == 400 and "`min_tokens` must be >= 0 and <= `max_tokens` (8)" in r.text, r.text
    assert fake.specs == []


def test_stop_sequence_and_eos_finish_as_stop(live: LiveServer) -> None:
    client = sdk(live)
    reply = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=5, stop="w1", temperature=0)
    assert reply.choices[0].message.content == " w0 w1" and reply.choices[0].finish_reason == "stop"


def test_chat_logprobs(live: LiveServer) -> None:
    reply = sdk(live).chat.completions.create(
        model="tgi", messages=MESSAGES, max_tokens=2, temperature=0, logprobs=True, top_logprobs=2
    )
    content = reply.choices[0].logprobs.content
    assert [c.token for c in content] == [" w0", " w1"]
    assert content[0].logprob == pytest.approx(-0.1)
    assert [t.token for t in content[1].top_logprobs] == [" w1", " x"]
    assert live.fake.specs[-1].parameters["top_n_tokens"] == 2


def test_validation_error_reaches_the_sdk_as_openais_error_object(live: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk(live).chat.completions.create(model="tgi", messages=MESSAGES, temperature=-1.0, stream=True)
    assert info.value.status_code == 400
    assert info.value.body == {"message": "`temperature` must be strictly positive", "type": "invalid_request_error",
                               "param": "temperature", "code": None}
    assert info.value.param == "temperature" and "must be strictly positive" in str(info.value)
    r = httpx.post(live.url + "/generate", json={"inputs": "x", "parameters": {"temperature": -1.0}})
    assert r.status_code == 422 and r.json()["error_type"] == "validation"  # TGI's shape stays on TGI's routes


def test_completions_single_and_batch(live: LiveServer) -> None:
    client = sdk(live)
    reply = client.completions.create(model="tgi", prompt="Once upon", max_tokens=2, temperature=0)
    assert reply.choices[0].text == " w0 w1" and reply.usage.completion_tokens == 2
    reply = client.completions.create(model="tgi", prompt=["a", "b c"], max_tokens=1, temperature=0, echo=True)
    assert [c.text for c in reply.choices] == ["a w0", "b c w0"]
    assert [c.index for c in reply.choices] == [0, 1]
    chunks = list(client.completions.create(model="tgi", prompt=["a", "b"], max_tokens=2, stream=True))
    by_index: dict[int, str] = {}
    for c in chunks:
        by_index[c.choices[0].index] = by_index.get(c.choices[0].index, "") + c.choices[0].text
    assert by_index == {0: " w0 w1", 1: " w0 w1"}


def test_models_lists_the_served_model(live: LiveServer) -> None:
    models = sdk(live).models.list()
    assert [m.id for m in models.data] == ["HuggingFaceTB/SmolLM2-135M-Instruct"]


def test_chat_stream_ends_with_done(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "stream": True})
    lines = [line for line in r.text.splitlines() if line]
    assert lines[-1] == "data: [DONE]"
    chunk = json.loads(lines[0][len("data:"):])
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"][0]["delta"] == {"role": "assistant", "content": " w0"}


def test_chat_rejects_what_it_cannot_do(client: TestClient, fake: FakeTritonClient) -> None:
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "n": 9})
    assert r.status_code == 400 and "`n` must be >= 1 and <= 8" in r.text
    assert client.post("/v1/chat/completions", json={"messages": []}).status_code == 400
    assert fake.specs == []


def test_tools_become_a_grammar_and_their_descriptions_reach_the_prompt(client: TestClient,
                                                                       fake: FakeTritonClient) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Find a word", "parameters": {}}}]
    client.post("/v1/chat/completions", json={"messages": MESSAGES, "tools": tools, "tool_choice": "required"})
    spec = fake.specs[-1]
    assert spec.parameters["grammar"]["value"]["properties"]["name"] == {"const": "lookup"}
    assert "Find a word" in spec.inputs  # the default model's template knows nothing of tools


def test_n_choices_are_separate_generations_with_their_own_seeds(client: TestClient, fake: FakeTritonClient) -> None:
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "n": 3, "seed": 10, "temperature": 0.7})
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [s.parameters["seed"] for s in fake.specs[-3:]] == [10, 11, 12]
    r = client.post("/v1/completions", json={"prompt": ["a", "b"], "n": 2, "max_tokens": 2})
    assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]
    streamed = client.post("/v1/completions", json={"prompt": "a", "n": 2, "max_tokens": 2, "stream": True}).text
    assert '"index":1' in streamed


def test_token_id_prompts_and_max_tokens_zero(client: TestClient, fake: FakeTritonClient) -> None:
    r = client.post("/v1/completions", json={"prompt": [[5, 6, 7]], "max_tokens": 0, "echo": True})
    assert r.status_code == 200
    assert fake.specs[-1].inputs == [5, 6, 7] and fake.specs[-1].parameters["max_new_tokens"] == 1
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 0
    r = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 1})
    assert fake.specs[-1].inputs == [1, 2]
    assert client.post("/v1/completions", json={"prompt": [[]]}).status_code == 400


def test_completions_best_of_draws_candidates_and_keeps_the_best_n(client: TestClient, fake: FakeTritonClient) -> None:
    r = client.post("/v1/completions", json={"prompt": ["a", "b"], "n": 2, "best_of": 3, "max_tokens": 2, "seed": 4})
    assert r.status_code == 200 and [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]
    assert [s.parameters["seed"] for s in fake.specs] == [4, 5, 6] * 2  # three candidates per prompt
    assert r.json()["usage"]["completion_tokens"] == 12  # all of them, as OpenAI bills best_of
    r = client.post("/v1/completions", json={"prompt": "a", "n": 3, "best_of": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"


def test_tool_choice_demanding_a_call_needs_tools(client: TestClient, fake: FakeTritonClient) -> None:
    for choice in ("required", "any", {"type": "function", "function": {"name": "f"}}):
        r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "tool_choice": choice, "tools": []})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert fake.specs == []
    assert client.post("/v1/chat/completions", json={"messages": MESSAGES, "tool_choice": "auto"}).status_code == 200


@pytest.mark.parametrize("extra,field", [
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages.0.content"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": "f"}},
     "`tool_choice.function.name`"),
])
def test_hostile_shapes_are_400_naming_the_field(client: TestClient, extra: dict, field: str) -> None:
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES} | extra)
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text  # was a 500 (TypeError...)


def test_an_earlier_tool_call_of_any_shape_renders(client: TestClient) -> None:
    earlier = {"role": "assistant", "content": None, "tool_calls": [{"function": "x"}, "y"]}
    assert client.post("/v1/chat/completions", json={"messages": [*MESSAGES, earlier]}).status_code == 200


@pytest.mark.parametrize("prompt", [[True], [1.0, 2], [[3, False]]])
def test_booleans_and_floats_are_no_token_ids(client: TestClient, fake: FakeTritonClient, prompt) -> None:
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    assert r.status_code == 400 and "prompt" in r.json()["error"]["message"], r.text
    assert fake.specs == []


class PairingClient(FakeTritonClient):
    """Two tokens per response, as a step that accepted a guessed token sends them."""

    async def stream(self, spec, request_id):
        held = None
        async for chunk in super().stream(spec, request_id):
            if held is None and not chunk.final:
                held = chunk
                continue
            if held is not None:
                chunk = replace(chunk, text=held.text + chunk.text, tokens=held.tokens + chunk.tokens,
                                top_tokens=held.top_tokens + chunk.top_tokens)
                held = None
            yield chunk


@pytest.mark.parametrize("route,body", [
    ("/v1/completions", {"prompt": "a", "logprobs": 1}),
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True}),
])
def test_a_response_of_several_tokens_streams_as_one_event_per_token(front_tokenizer, route, body) -> None:
    app = create_app(FrontConfig(model_id=MODEL_ID), PairingClient(), front_tokenizer)
    with TestClient(app) as client:
        text = client.post(route, json=body | {"max_tokens": 5, "stream": True}).text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    choices = [e["choices"][0] for e in events if e["choices"]]
    pieces = [c.get("text", c.get("delta", {}).get("content")) for c in choices]
    assert pieces == [" w0", " w1", " w2", " w3", " w4"]
    assert [c["finish_reason"] for c in choices] == [None] * 4 + ["length"]
