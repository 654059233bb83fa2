"""Tool calling on any model: tools to a grammar, the answer to OpenAI's tool_calls, streamed or not."""

from __future__ import annotations

import json
import random
import re

import pytest

from tgi_llm.front.errors import FrontError
from tgi_llm.front.response_format import response_format_grammar
from tgi_llm.front.tools import NO_TOOL, ToolCallStream, parse_answer, plan_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "q": {"type": "string"}}}}}


def test_tool_choice_decides_which_functions_the_grammar_allows():
    assert plan_tools([WEATHER], "none") is None and plan_tools(None, "auto") is None
    auto = plan_tools([WEATHER, SEARCH], "auto")
    assert [f.name for f in auto.functions] == ["get_weather", "search", NO_TOOL]
    assert len(auto.grammar["value"]["anyOf"]) == 3
    required = plan_tools([WEATHER, SEARCH], "required")
    assert [f.name for f in required.functions] == ["get_weather", "search"]
    named = plan_tools([WEATHER, SEARCH], {"type": "function", "function": {"name": "search"}})
    schema = named.grammar["value"]
    assert schema["properties"]["name"] == {"const": "search"}
    assert list(schema["properties"]) == ["name", "arguments"]  # the name is generated first


@pytest.mark.parametrize(("tools", "choice", "message"), [
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "`tool_choice.function.name` 'nope' is not one"),
    ([WEATHER], "sometimes", "`tool_choice` must be"),
    ([WEATHER, WEATHER], "auto", "distinct function names"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}], "auto",
     "`tools[0].function.parameters` cannot be compiled"),
    ([{"type": "retrieval"}], "auto", "`tools[0]` must be"),
])
def test_bad_tools_are_validation_errors_naming_the_field(tools, choice, message):
    with pytest.raises(FrontError, match=re.escape(message)) as info:
        plan_tools(tools, choice)
    assert info.value.status == 422


def test_an_answer_is_a_call_or_text_or_incomplete():
    call = parse_answer('{"name":"get_weather","arguments":{"city":"Paris"}}')
    assert call.is_call and call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    text = parse_answer('{"name":"no_tool","arguments":{"content":"Hello!"}}')
    assert not text.is_call and text.content == "Hello!"
    assert parse_answer('{"name":"get_weather","argum') is None


def test_a_streamed_call_sends_its_header_then_argument_pieces_that_add_up():
    answer = '{"name":"get_weather","arguments":{"city":"Paris","days":3}}'
    stream = ToolCallStream()
    pieces = []
    for i in range(0, len(answer), 5):
        pieces += stream.feed(answer[i : i + 5])
    rest, parsed = stream.finish()
    pieces += rest
    assert pieces[0]["function"] == {"name": "get_weather", "arguments": ""} and pieces[0]["id"].startswith("call_")
    assert "".join(p["function"]["arguments"] for p in pieces[1:]) == '{"city":"Paris","days":3}'
    assert parsed.is_call and all("id" not in p for p in pieces[1:])


def test_a_streamed_no_tool_answer_sends_no_tool_call():
    stream = ToolCallStream()
    answer = '{"name":"no_tool","arguments":{"content":"Just text"}}'
    assert stream.feed(answer[:30]) == [] and stream.feed(answer[30:]) == []
    rest, parsed = stream.finish()
    assert rest == [] and parsed.content == "Just text"


def _split(rng, text: str) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, min(12, len(text) - 1))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_streamed_calls_come_out_the_same_however_the_answer_is_cut():
    rng = random.Random(0)
    call = '{"name":"get_weather","arguments":{"city":"Paris","days":3}}'
    for _ in range(200):
        stream = ToolCallStream()
        pieces = [p for chunk in _split(rng, call) for p in stream.feed(chunk)]
        rest, parsed = stream.finish()
        pieces += rest
        assert pieces[0]["function"] == {"name": "get_weather", "arguments": ""}
        assert "".join(p["function"]["arguments"] for p in pieces[1:]) == '{"city":"Paris","days":3}'
        assert stream.text == call and parsed.is_call
    no_tool = '{"name":"no_tool","arguments":{"content":"Just text"}}'
    for _ in range(50):
        stream = ToolCallStream()
        assert [p for chunk in _split(rng, no_tool) for p in stream.feed(chunk)] == []
        assert stream.finish() == ([], parse_answer(no_tool))


def test_a_long_answer_is_not_searched_or_parsed_again_at_every_piece(monkeypatch):
    loads = []
    real_loads = json.loads
    monkeypatch.setattr("tgi_llm.front.tools.json.loads", lambda s, *a, **k: loads.append(len(s)) or real_loads(s))
    for name in ("get_weather", NO_TOOL):
        loads.clear()
        stream = ToolCallStream()
        sent = stream.feed(f'{{"name":"{name}","arguments":{{"text":"')
        for _ in range(5_000):
            sent += stream.feed("word ")
        assert len(loads) == 1 and loads[0] < 40  # the header alone, once
        if name != NO_TOOL:  # each character sent once (the last held back)
            assert "".join(p["function"]["arguments"] for p in sent) == '{"text":"' + "word " * 4_999 + "word"


@pytest.mark.parametrize(("fmt", "grammar"), [
    (None, None), ({"type": "text"}, None), ({"type": "json_object"}, {"type": "json_object"}),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}, "strict": True}},
     {"type": "json", "value": {"type": "integer"}}),
    ({"type": "json", "value": {"type": "boolean"}}, {"type": "json", "value": {"type": "boolean"}}),
    ({"type": "regex", "value": "[0-9]+"}, {"type": "regex", "value": "[0-9]+"}),
])
def test_response_formats_become_the_grammar_parameter(fmt, grammar):
    assert response_format_grammar(fmt) == grammar


@pytest.mark.parametrize(("fmt", "message"), [
    ({"type": "yaml"}, "`response_format.type` must be one of"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}},
     "`response_format.json_schema.schema` cannot be compiled"),
    ("json", "`response_format` must be an object"),
])
def test_bad_response_formats_name_the_field(fmt, message):
    with pytest.raises(FrontError, match=re.escape(message)):
        response_format_grammar(fmt)
