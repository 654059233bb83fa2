"""The whole path with the real default model: `tgi-llm-launcher` (tritonserver + the tgi_llm model) and
`tgi-llm-front` next to it, each a process on free 127.0.0.1 ports, driven by the official clients."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .stack import Stack, start_front, stop

pytestmark = [pytest.mark.integration, pytest.mark.slow]
openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
NEW = 16
KEY = "integration-key"


def triton_generate(stack: Stack, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The model's answer straight from Triton's generate endpoint, not through the front."""
    r = httpx.post(f"{stack.triton_http}/v2/models/tgi_llm/generate", timeout=120,
                   json={"text_input": prompt, "max_tokens": max_tokens})
    r.raise_for_status()
    return r.json()


def metric(stack: Stack, name: str) -> float:
    text = httpx.get(stack.front + "/metrics").text  # proxied from Triton's metrics port
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_openai_chat_equals_triton_greedy_text(stack: Stack, front_tokenizer: Any) -> None:
    prompt = front_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    direct = triton_generate(stack, prompt, NEW)
    client = openai.OpenAI(base_url=f"{stack.front}/v1", api_key="-", max_retries=0)

    reply = client.chat.completions.create(model="SmolLM2", messages=MESSAGES, max_tokens=NEW, temperature=0)
    assert reply.choices[0].message.content == direct["text_output"]
    assert reply.usage.prompt_tokens == direct["num_input_tokens"]
    assert reply.usage.completion_tokens == direct["num_output_tokens"]
    assert reply.usage.total_tokens == direct["num_input_tokens"] + direct["num_output_tokens"]
    assert reply.choices[0].finish_reason == ("length" if direct["finish_reason"] == "length" else "stop")

    chunks = list(client.chat.completions.create(model="SmolLM2", messages=MESSAGES, max_tokens=NEW, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == direct["text_output"]
    assert chunks[-1].usage.completion_tokens == direct["num_output_tokens"]
    assert chunks[-1].usage.prompt_tokens == direct["num_input_tokens"]


def test_hf_inference_client_stream_and_not(stack: Stack) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=stack.front)
    prompt = "The three primary colors are"
    whole = client.text_generation(prompt, max_new_tokens=NEW, details=True)
    events = list(client.text_generation(prompt, max_new_tokens=NEW, details=True, stream=True))
    assert whole.generated_text == triton_generate(stack, prompt, NEW)["text_output"]
    assert [e.token.id for e in events] == [t.id for t in whole.details.tokens]
    assert [e.token.text for e in events] == [t.text for t in whole.details.tokens]
    assert events[-1].generated_text == whole.generated_text
    assert events[-1].details.finish_reason == whole.details.finish_reason
    assert events[-1].details.generated_tokens == whole.details.generated_tokens == len(events)


def test_validation_errors_name_the_field_in_each_apis_shape(stack: Stack) -> None:
    expected = {"error": "`top_n_tokens` must be >= 0 and <= 5. Given: 50", "error_type": "validation"}
    for route in ("/generate", "/generate_stream"):
        r = httpx.post(stack.front + route, json={"inputs": "hi", "parameters": {"top_n_tokens": 50}})
        assert (r.status_code, r.json()) == (422, expected)
    client = openai.OpenAI(base_url=f"{stack.front}/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:  # OpenAI's error object on OpenAI's routes
        client.chat.completions.create(model="m", messages=MESSAGES, top_p=1.5, stream=True)
    assert info.value.body["message"] == "`top_p` must be > 0.0 and < 1.0" and info.value.param == "top_p"


#: Bodies the model refuses (so they travel to it and back as error responses), each with the field named.
REFUSED = [({"inputs": "hi", "parameters": {"max_new_tokens": 100000}}, "max_new_tokens"),
           ({"inputs": "hi", "parameters": {"temperature": -1}}, "temperature"),
           ({"inputs": "hi", "parameters": {"top_n_tokens": 50}}, "top_n_tokens"),
           ({"inputs": "hi", "parameters": {"grammar": {"type": "regex", "value": "(("}}}, "grammar")]


async def _refused_storm(stack: Stack, count: int) -> dict[str, int]:
    """`count` requests, 16 at a time: through the front (TGI routes) and through the gateway's gRPC with
    `triton_grpc_error` (the mode whose handling in tritonserver crashed it), one in ten valid."""
    import asyncio

    import grpc
    from tritonclient.grpc import service_pb2

    outcomes: dict[str, int] = {}
    gate = asyncio.Semaphore(16)

    def grpc_request(body: dict) -> bytes:
        request = service_pb2.ModelInferRequest(model_name="tgi_llm")
        prompt = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
        prompt.contents.bytes_contents.append(body["inputs"].encode())
        for key, value in body["parameters"].items():
            if isinstance(value, int):
                request.parameters[key].int64_param = value
            else:
                request.parameters[key].string_param = json.dumps(value)
        return request.SerializeToString()

    async with httpx.AsyncClient(timeout=120) as http, grpc.aio.insecure_channel(stack.grpc) as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")

        async def one(i: int) -> None:
            body, field = REFUSED[i % len(REFUSED)]
            async with gate:
                if i % 10 == 0:
                    r = await http.post(stack.front + "/generate",
                                        json={"inputs": "Hello", "parameters": {"max_new_tokens": 2}})
                    outcome = f"valid {r.status_code}"
                elif i % 3 == 0:
                    call = stream(iter([grpc_request(body)]), metadata=(("triton_grpc_error", "true"),))
                    try:
                        outcome = f"grpc {[r async for r in call]}"
                    except grpc.aio.AioRpcError as exc:
                        named = f"`{field}`" in (exc.details() or "")
                        outcome = f"grpc {exc.code().name}" + ("" if named else f" unnamed: {exc.details()}")
                else:
                    r = await http.post(stack.front + ("/generate_stream" if i % 2 else "/generate"), json=body)
                    named = r.status_code == 422 and f"`{field}`" in r.text and "[tgi_llm" not in r.text
                    outcome = f"front {r.status_code}" + ("" if named else f" {r.text[:200]}")
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

        await asyncio.gather(*(one(i) for i in range(count)))
    return outcomes


def test_a_storm_of_refused_requests_leaves_tritonserver_up(stack: Stack) -> None:
    """Each refused request ends in one error naming its field, with TGI's status (front) or gRPC's
    (gateway), and tritonserver is the same process afterwards: its `triton_grpc_error` handling crashed it
    (SIGSEGV) within ~1,000 such requests, so neither the front nor the gateway uses it any more."""
    import asyncio

    before = stack.tritonserver_pid()
    count = 1500
    outcomes = asyncio.run(_refused_storm(stack, count))
    valid = len(range(0, count, 10))
    by_grpc = len([i for i in range(count) if i % 10 and i % 3 == 0])
    assert outcomes == {"valid 200": valid, "grpc INVALID_ARGUMENT": by_grpc, "front 422": count - valid - by_grpc}
    assert stack.tritonserver_pid() == before is not None


def test_closing_a_stream_early_frees_its_blocks(stack: Stack, front_tokenizer: Any) -> None:
    story = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]
    prompt = front_tokenizer.apply_chat_template(story, tokenize=False, add_generation_prompt=True)
    cancelled_before = metric(stack, 'tgi_request_failure{err="cancelled"}')
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 400}}
    with httpx.Client(base_url=stack.front, timeout=120) as http, \
            http.stream("POST", "/generate_stream", json=body) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data:"))
        next(lines), next(lines)
    deadline = time.monotonic() + 120
    while metric(stack, 'tgi_request_failure{err="cancelled"}') == cancelled_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(stack, 'tgi_request_failure{err="cancelled"}') == cancelled_before + 1  # not run to its end
    while metric(stack, "tgi_kv_blocks_used") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(stack, "tgi_kv_blocks_used") == 0
    assert metric(stack, "tgi_kv_blocks_free") == metric(stack, "tgi_kv_blocks_total") > 0


def test_api_key(stack: Stack, default_model_dir: Path, tmp_path: Path) -> None:
    proc, url = start_front(stack.grpc, stack.metrics, default_model_dir, tmp_path, "--api-key", KEY)
    try:
        body = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}
        assert httpx.post(url + "/generate", json=body).status_code == 401
        r = httpx.post(url + "/generate", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert r.status_code == 200 and r.json()["generated_text"]
        assert httpx.get(url + "/health").status_code == 200
        assert "tgi_request_count" in httpx.get(url + "/metrics").text
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        assert openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0).models.list().data[0].id == "SmolLM2"
    finally:
        stop(proc)


def test_openai_takes_vllms_extra_sampling_fields(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.front}/v1", api_key="-", max_retries=0)
    short = [{"role": "user", "content": "Say OK."}]
    greedy = client.chat.completions.create(model="m", messages=short, max_tokens=40, temperature=0)
    assert greedy.usage.completion_tokens < 40  # the model ends its answer itself...
    for extra in ({"ignore_eos": True}, {"min_tokens": 40}):  # ...unless told to go on
        reply = client.chat.completions.create(model="m", messages=short, max_tokens=40, temperature=0,
                                               extra_body=extra | {"speculate": 0})
        assert reply.usage.completion_tokens == 40 and reply.choices[0].finish_reason == "length"
        assert reply.choices[0].message.content.startswith(greedy.choices[0].message.content)
    top1 = client.chat.completions.create(model="m", messages=short, max_tokens=40, temperature=1.5, seed=3,
                                          extra_body={"top_k": 1})
    assert top1.choices[0].message.content == greedy.choices[0].message.content  # one candidate: the argmax
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        client.chat.completions.create(model="m", messages=short, max_tokens=4, extra_body={"min_tokens": 5})


def test_seed_round_trips_and_repeats(stack: Stack) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=stack.front)
    seed = 2**63 + 5  # beyond int64: travels as Triton's UINT64 seed tensor
    runs = [client.text_generation("Once upon a time", max_new_tokens=8, do_sample=True, temperature=1.5,
                                   seed=seed, details=True) for _ in range(2)]
    assert runs[0].details.seed == runs[1].details.seed == seed
    assert runs[0].generated_text == runs[1].generated_text
    info = httpx.get(stack.front + "/info").json()
    assert info["max_input_tokens"] == 511 and info["max_total_tokens"] == 512
    assert info["model_family"] == "llama"  # the native family serving it


def test_openai_usage_reports_the_prompt_tokens_served_from_the_prefix_cache(stack: Stack) -> None:
    system = {"role": "system", "content": "You answer in one word. " * 20}
    client = openai.OpenAI(base_url=f"{stack.front}/v1", api_key="-", max_retries=0)
    replies = [client.chat.completions.create(model="SmolLM2", max_tokens=4, temperature=0,
                                              messages=[system, {"role": "user", "content": q}])
               for q in ("Name a color.", "Name a fruit.")]
    assert replies[1].usage.prompt_tokens_details.cached_tokens >= 96
    assert replies[1].usage.prompt_tokens_details.cached_tokens < replies[1].usage.prompt_tokens


# ---- structured output and tool calls, with the clients people use ----

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
                   "required": ["timezone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def _args_valid(name: str, arguments: str) -> None:
    import jsonschema

    tool = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[name]
    jsonschema.validate(json.loads(arguments), tool["function"]["parameters"])


def test_openai_tool_calls_parse_and_validate_streaming_and_not(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.front}/v1", api_key="-", max_retries=0)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        reply = client.chat.completions.create(model="SmolLM2", messages=ASK, tools=[WEATHER_TOOL, TIME_TOOL],
                                               tool_choice=choice, max_tokens=80, temperature=0)
        assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None
        (call,) = reply.choices[0].message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        _args_valid(call.function.name, call.function.arguments)
        if isinstance(choice, dict):
            assert call.function.name == "get_weather"

        chunks = list(client.chat.completions.create(model="SmolLM2", messages=ASK, tools=[WEATHER_TOOL, TIME_TOOL],
                                                     tool_choice=choice, max_tokens=80, temperature=0, stream=True))
        deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
        assert deltas[0].function.name == call.function.name and deltas[0].id
        assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_openai_auto_tool_choice_answers_with_a_call_or_text(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.front}/v1", api_key="-", max_retries=0)
    for messages in (ASK, [{"role": "user", "content": "Say hello to me."}]):
        reply = client.chat.completions.create(model="SmolLM2", messages=messages, tools=[WEATHER_TOOL],
                                               tool_choice="auto", max_tokens=80, temperature=0)
        message = reply.choices[0].message
        if message.tool_calls:
            assert reply.choices[0].finish_reason == "tool_calls"
            _args_valid(message.tool_calls[0].function.name, message.tool_calls[0].function.arguments)
        else:
            assert isinstance(message.content, str) and reply.choices[0].finish_reason in ("stop", "length")


def test_openai_response_format_and_pydantic_parse(stack: Stack) -> None:
    import jsonschema
    from pydantic import BaseModel

    client = openai.OpenAI(base_url=f"{stack.front}/v1", api_key="-", max_retries=0)
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 30},
                                               "population_millions": {"type": "integer", "minimum": 0}},
              "required": ["capital", "population_millions"], "additionalProperties": False}
    reply = client.chat.completions.create(
        model="SmolLM2", messages=[{"role": "user", "content": "Tell me about France."}], max_tokens=60,
        seed=1,  # sampled but reproducible: greedy repeats one digit forever, an unseeded draw can run long
        response_format={"type": "json_schema", "json_schema": {"name": "country", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    anything = client.chat.completions.create(
        model="SmolLM2", messages=[{"role": "user", "content": "Describe a cat as a JSON object with two keys."}],
        max_tokens=120, response_format={"type": "json_object"}, temperature=0)
    assert anything.choices[0].message.content.startswith("{")
    if anything.choices[0].finish_reason == "stop":  # else cut by max_tokens, as OpenAI's would be
        assert isinstance(json.loads(anything.choices[0].message.content), dict)

    class City(BaseModel):
        name: str
        country: str

    parsed = client.beta.chat.completions.parse(model="SmolLM2", response_format=City, max_tokens=60, seed=1,
                                                messages=[{"role": "user", "content": "Name a city in Japan."}])
    assert isinstance(parsed.choices[0].message.parsed, City)


def test_hf_inference_client_grammar_and_tools(stack: Stack) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=stack.front)
    out = client.text_generation("The year the first man walked on the moon:", max_new_tokens=10,
                                 grammar={"type": "regex", "value": "[0-9]{4}"})
    assert re.fullmatch(r"[0-9]{4}", out)
    out = client.text_generation("A person as JSON:", max_new_tokens=60, details=True,
                                 grammar={"type": "json", "value": {"type": "object", "properties": {
                                     "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["age"]}})
    assert isinstance(json.loads(out.generated_text)["age"], int)
    chat = client.chat_completion(messages=ASK, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=80)
    call = chat.choices[0].message.tool_calls[0]
    _args_valid(call.function.name, json.dumps(call.function.arguments) if isinstance(call.function.arguments, dict)
                else call.function.arguments)


def test_grammar_errors_are_4xx_naming_the_field_and_the_server_goes_on(stack: Stack) -> None:
    bad = [
        ("/generate", {"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "[a-"}}}, "`grammar`"),
        ("/generate", {"inputs": "x", "parameters": {"grammar": {"type": "yaml", "value": "a"}}}, "`grammar.type`"),
        ("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER_TOOL],
                                  "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "`tool_choice.function.name`"),
        ("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER_TOOL], "response_format": {"type": "json_object"}},
         "`tools` and `response_format`"),
        ("/v1/chat/completions", {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {
            "schema": {"type": "array", "uniqueItems": True}}}}, "`response_format.json_schema.schema`"),
    ]
    for route, body, field in bad:
        r = httpx.post(stack.front + route, json=body, timeout=60)
        assert 400 <= r.status_code < 500, (route, r.status_code, r.text)
        assert field in r.text
    r = httpx.post(stack.front + "/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 3}}, timeout=60)
    assert r.status_code == 200


def test_n_choices_best_of_and_completion_logprobs_with_the_sdks(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.front}/v1", api_key="-", max_retries=0)
    two = client.chat.completions.create(model="SmolLM2", messages=MESSAGES, n=2, max_tokens=8, temperature=0.9,
                                         seed=3)
    assert [c.index for c in two.choices] == [0, 1] and all(c.message.content for c in two.choices)
    echoed = client.completions.create(model="SmolLM2", prompt="The capital of France is", max_tokens=1,
                                       logprobs=2, echo=True, temperature=0)
    lp = echoed.choices[0].logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first prompt token has none
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert echoed.choices[0].text.startswith("The capital of France is")
    assert all(t <= 0 for t in lp.token_logprobs[1:]) and all(len(top) <= 2 for top in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)

    from huggingface_hub import InferenceClient

    best = InferenceClient(model=stack.front).text_generation("Once upon a time", max_new_tokens=6, best_of=2,
                                                              do_sample=True, details=True)
    assert len(best.details.best_of_sequences) == 1


def test_server_sent_events_are_strict(stack: Stack) -> None:
    """`data: ` with one space, one JSON object per event, events apart by a blank line (genai-perf's parser)."""
    body = {"model": "SmolLM2", "messages": MESSAGES, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", stack.front + "/v1/chat/completions", json=body, timeout=60) as r:
        raw = "".join(r.iter_text())
    events = [e for e in raw.split("\n\n") if e]
    assert len(events) >= 3 and events[-1] == "data: [DONE]"
    for e in events[:-1]:
        assert e.startswith("data: {") and "\n" not in e
        json.loads(e[len("data: "):])


def test_text_generation_client_generate_stream_details_and_grammar(stack: Stack) -> None:
    """TGI's own Python client (`text-generation`), unchanged: its pydantic models parse our answers."""
    text_generation = pytest.importorskip("text_generation")
    from text_generation.types import Grammar, GrammarType

    client = text_generation.Client(stack.front, timeout=120)
    whole = client.generate("The capital of France is", max_new_tokens=8, decoder_input_details=True)
    assert whole.details.generated_tokens == len(whole.details.tokens) <= 8
    assert whole.details.prefill[0].logprob is None and len(whole.details.prefill) > 1
    streamed = [r for r in client.generate_stream("The capital of France is", max_new_tokens=8)]
    assert "".join(r.token.text for r in streamed) == whole.generated_text
    assert streamed[-1].generated_text == whole.generated_text and streamed[-1].details.finish_reason
    year = client.generate("The first man walked on the moon in", max_new_tokens=8,
                           grammar=Grammar(type=GrammarType.Regex, value="[0-9]{4}"))
    assert re.fullmatch(r"[0-9]{4}", year.generated_text)
    with pytest.raises(text_generation.errors.ValidationError, match="max_new_tokens"):
        client.generate("Hi", max_new_tokens=10**6)
