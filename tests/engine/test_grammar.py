"""Grammar specs from every request shape, compiled once per content, errors naming the field."""

from __future__ import annotations

import json

import pytest

from tgi_llm.engine.grammar import ANY_JSON_OBJECT, GrammarCompiler, GrammarSpec
from tgi_llm.errors import ValidationError


@pytest.mark.parametrize(("raw", "kind", "value"), [
    ({"type": "json", "value": {"type": "integer"}}, "json_schema", '{"type":"integer"}'),
    ({"type": "json", "value": '{"type": "integer"}'}, "json_schema", '{"type":"integer"}'),
    ({"type": "json_object"}, "json_schema", ANY_JSON_OBJECT),
    ({"type": "regex", "value": "[0-9]+"}, "regex", "[0-9]+"),
    ({"type": "ebnf_grammar", "value": "root ::= [0-9]+"}, "lark", "root ::= [0-9]+"),
    ('{"type": "regex", "value": "a|b"}', "regex", "a|b"),  # a Triton request parameter arrives as text
])
def test_request_shapes_become_one_spec(raw, kind, value):
    assert GrammarSpec.parse(raw) == GrammarSpec(kind, value)


@pytest.mark.parametrize(("raw", "message"), [
    ({"value": "x"}, "`grammar` must be an object with `type` and `value`"),
    ("not json", "`grammar` must be an object with `type` and `value`"),
    ({"type": "yaml", "value": "x"}, "`grammar.type` must be one of json, regex, json_object, lark"),
    ({"type": "regex"}, "`grammar.value` must be a non-empty string"),
    ({"type": "json", "value": "{oops"}, "`grammar.value` is not valid JSON"),
    ({"type": "json", "value": [1, 2]}, "`grammar.value` must be a JSON Schema object"),
])
def test_malformed_grammars_name_the_field(raw, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GrammarSpec.parse(raw)


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, len(tokenizer), {tokenizer.eos_token_id})


def test_a_grammar_compiles_once_and_each_request_gets_a_fresh_matcher(compiler, tokenizer):
    spec = GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    first = compiler.compile(spec)
    hits = compiler.stats.cache_hits
    again = compiler.compile(GrammarSpec.json_schema(json.dumps({"type": "object",
                                                                 "properties": {"a": {"type": "integer"}}})))
    assert again is first and compiler.stats.cache_hits == hits + 1
    (brace,) = tokenizer("{", add_special_tokens=False)["input_ids"]
    a, b = first.matcher(), first.matcher()
    a.consume_token(brace)
    assert a.validate_tokens([brace]) == 0  # a has moved on: a second brace is not allowed there
    assert b.validate_tokens([brace]) == 1  # b has not


@pytest.mark.parametrize(("spec", "message"), [
    (GrammarSpec("regex", "[a-"), "`grammar` cannot be compiled: "),
    (GrammarSpec("json_schema", '{"type": "foo"}'), "`grammar` cannot be compiled: "),
    (GrammarSpec("json_schema", '{"type": "array", "uniqueItems": true}'), "`grammar` cannot be compiled: "),
    (GrammarSpec("lark", "start: undefined_rule"), "`grammar` cannot be compiled: "),
])
def test_what_cannot_compile_is_a_validation_error_with_the_reason(compiler, spec, message):
    with pytest.raises(ValidationError, match=message) as info:
        compiler.compile(spec)
    assert len(str(info.value)) > len(message)  # the library's reason follows
