"""The front against an adversarial client, on the real launched stack with real HTTP clients: CPU-heavy
requests leave /health answering, text too long to be a prompt and impossible token ids are 4xx naming the
field on a connection kept alive, and `tool_choice` without tools or completions' `best_of` are not ignored."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from .stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
openai = pytest.importorskip("openai")

#: A hang guard, not a timing: a 1.9 MB /tokenize on the event loop held /health ~9 s on 2 cores.
HEALTH_BOUND_S = 2.0
#: SmolLM2's vocabulary: its longest entry (the bound's characters per token) and its size.
LONGEST_TOKEN_CHARS = 81
VOCAB = 49152


def sdk(stack: Stack) -> Any:
    return openai.OpenAI(base_url=f"{stack.front}/v1", api_key="-", max_retries=0, timeout=120)


def max_input_tokens(stack: Stack) -> int:
    return httpx.get(stack.front + "/info").json()["max_input_tokens"]


def health_during(stack: Stack, send: Callable[[], Any]) -> tuple[Any, list[float]]:
    """`send()` in a thread while /health is polled on a connection of its own: what `send` returned and how
    long each poll took."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(send()))
    latencies = []
    with httpx.Client(base_url=stack.front, timeout=60) as http:
        assert http.get("/health").status_code == 200  # connected before the heavy request goes
        worker.start()
        while worker.is_alive():
            start = time.monotonic()
            assert http.get("/health").status_code == 200
            latencies.append(time.monotonic() - start)
            time.sleep(0.02)
    worker.join()
    return out[0], latencies


def test_a_huge_tokenize_is_refused_from_its_length_while_health_answers(stack: Stack) -> None:
    limit = max_input_tokens(stack)
    body = {"inputs": "word " * 380_000}  # 1.9 MB, under the payload limit

    r, latencies = health_during(stack, lambda: httpx.post(stack.front + "/tokenize", json=body, timeout=120))
    assert max(latencies, default=0.0) < HEALTH_BOUND_S, latencies
    assert r.status_code == 422 and r.json() == {
        "error": f"`inputs` must have less than {limit} tokens. Given: 1900000 characters, more than {limit} "
                 f"tokens of at most {LONGEST_TOKEN_CHARS} characters each can hold",
        "error_type": "validation"}
    # Up to the bound it is tokenized, as TGI does.
    r = httpx.post(stack.front + "/tokenize", json={"inputs": "w" * (limit * LONGEST_TOKEN_CHARS)}, timeout=120)
    assert r.status_code == 200 and r.json()[0]["start"] == 0


def test_huge_chats_are_parsed_and_rendered_off_the_event_loop(stack: Stack) -> None:
    """60,000 empty messages (1.98 MB) render a 1.7 M-character prompt: ~1 s of parsing and templating each,
    which ran on the event loop; four at once held /health for seconds."""
    client = sdk(stack)
    messages = [{"role": "user", "content": ""}] * 60_000

    def one(_: int) -> Any:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="m", messages=messages, max_tokens=1)
        return info.value

    def four() -> list[Any]:
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(one, range(4)))

    errors, latencies = health_during(stack, four)
    assert max(latencies, default=0.0) < HEALTH_BOUND_S, latencies
    assert len(latencies) >= 3  # /health was asked while the chats were in flight
    for err in errors:
        assert err.param == "messages"
        assert "characters once rendered with the chat template" in err.body["message"]


def test_chat_content_too_long_for_a_prompt_is_refused_before_the_template(stack: Stack) -> None:
    limit = max_input_tokens(stack)
    text = "word " * (limit * LONGEST_TOKEN_CHARS // 5 + 1)
    with pytest.raises(openai.BadRequestError) as info:
        sdk(stack).chat.completions.create(model="m", messages=[{"role": "user", "content": text}], max_tokens=1)
    assert info.value.param == "messages"
    assert info.value.body["message"].startswith(
        f"`messages` must have less than {limit} tokens. Given: {len(text)} characters of content")


#: Lone surrogates (JSON allows "\ud800"; UTF-8 does not) in each text field: route, body, field named.
SURROGATES = [
    ("/generate", b'{"inputs": "a\\ud800"}', "inputs"),
    ("/generate", b'{"inputs": "a", "parameters": {"stop": ["\\udfff"]}}', "parameters.stop.0"),
    ("/generate_stream", b'{"inputs": "\\ud800"}', "inputs"),
    ("/tokenize", b'{"inputs": "\\ud800"}', "inputs"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages.0.content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
                             b'"function": {"name": "f\\ud800"}}]}', "tools.0.function.name"),
    ("/v1/completions", b'{"prompt": ["ok", "\\ud800"]}', "prompt.1"),
]
#: Token ids no vocabulary has: negative, past the vocabulary, past int64 (OverflowError once).
BAD_IDS = [[-1], [VOCAB], [2**63], [[1, 2], [3, 2**64]]]


def test_lone_surrogates_and_bad_token_ids_are_4xx_naming_the_field_on_a_kept_connection(stack: Stack) -> None:
    log_before = stack.log.read_text() if stack.log else ""
    with httpx.Client(base_url=stack.front, timeout=120) as http:
        first = http.get("/health")
        where = first.extensions["network_stream"].get_extra_info("client_addr")
        for route, body, field in SURROGATES:
            r = http.post(route, content=body, headers={"Content-Type": "application/json"})
            message = r.json()["error"]["message"] if route.startswith("/v1/") else r.json()["error"]
            assert r.status_code == (400 if route.startswith("/v1/") else 422), (route, r.text)
            assert f"`{field}`" in message and "surrogate" in message, (route, message)
            assert r.headers.get("connection") != "close"
            assert r.extensions["network_stream"].get_extra_info("client_addr") == where  # kept alive
        for prompt in BAD_IDS:
            r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
            bad = next(t for p in (prompt if isinstance(prompt[0], list) else [prompt]) for t in p
                       if not 0 <= t < VOCAB)
            assert (r.status_code, r.json()["error"]["param"]) == (400, "prompt"), r.text
            assert r.json()["error"]["message"] == f"`prompt` token ids must be integers in [0, {VOCAB}). Given: {bad}"
            assert r.extensions["network_stream"].get_extra_info("client_addr") == where
    with pytest.raises(openai.BadRequestError) as info:  # the SDK sees OpenAI's error object
        sdk(stack).completions.create(model="m", prompt=[5, -7], max_tokens=1)
    assert info.value.param == "prompt"
    if stack.log:  # one line per refusal at most, never a traceback
        assert "Traceback" not in stack.log.read_text()[len(log_before):]


def test_tool_choice_that_demands_a_call_without_tools_is_refused(stack: Stack) -> None:
    client = sdk(stack)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="m", messages=messages, tool_choice=choice, max_tokens=4)
        assert info.value.param == "tool_choice" and "requires `tools`" in info.value.body["message"]
    reply = client.chat.completions.create(model="m", messages=messages, tool_choice="auto", max_tokens=2)
    assert reply.choices[0].message.content  # "auto" without tools: plain text, as OpenAI answers


def test_completions_best_of_draws_that_many_candidates_and_returns_the_best(stack: Stack) -> None:
    client = sdk(stack)
    reply = client.completions.create(model="m", prompt="Once upon a time", max_tokens=4, best_of=3, temperature=1.0,
                                      logprobs=0, seed=7)
    (choice,) = reply.choices
    returned = len(choice.logprobs.tokens)
    # Every candidate's tokens are counted (OpenAI bills them): the two that lost made one token at least.
    assert reply.usage.completion_tokens >= returned + 2
    two = client.completions.create(model="m", prompt="Once upon a time", max_tokens=4, best_of=3, n=2, seed=7)
    assert [c.index for c in two.choices] == [0, 1]
    for kwargs in ({"best_of": 1, "n": 2}, {"best_of": 3, "stream": True}):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="m", prompt="Once upon a time", max_tokens=4, **kwargs)
        assert info.value.param == "best_of"


def test_top_tokens_the_sampler_ruled_out_are_no_infinite_logprobs(stack: Stack) -> None:
    """Found by the fuzzer: a top_n_tokens alternative that top_k or a grammar ruled out had logprob -inf: a 500
    (`Out of range float values are not JSON compliant`) on /generate, `-Infinity` in /generate_stream."""
    body = {"inputs": "0", "parameters": {"details": True, "top_n_tokens": 2, "top_k": 1, "max_new_tokens": 2}}
    r = httpx.post(stack.front + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert [len(top) for top in r.json()["details"]["top_tokens"]] == [1, 1]
    r = httpx.post(stack.front + "/generate_stream", json=body, timeout=120)
    assert r.status_code == 200 and "Infinity" not in r.text and "NaN" not in r.text, r.text
    chat = {"messages": [{"role": "user", "content": "0"}], "max_tokens": 1, "logprobs": True, "top_logprobs": 3,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["x"]}}}}
    r = httpx.post(stack.front + "/v1/chat/completions", json=chat, timeout=120)
    assert r.status_code == 200 and "Infinity" not in r.text, r.text
