"""OpenAI's `response_format` (and TGI's shape of it) as the `grammar` parameter the model takes."""

from __future__ import annotations

import json
from typing import Any

from tgi_llm.front.errors import validation


def check_json_schema(schema: Any, field_name: str) -> None:
    """Reject a schema the grammar engine cannot compile, naming the request field (no tokenizer needed)."""
    import llguidance

    try:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text)
        error = llguidance.LLMatcher.validate_grammar(grammar)
    except Exception as exc:
        error = str(exc)
    if error:
        raise validation(f"`{field_name}` cannot be compiled: {error.strip().splitlines()[0][:300]}")


def response_format_grammar(response_format: Any) -> dict[str, Any] | None:
    """None for plain text. OpenAI: {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name",
    "schema", "strict"}}; TGI: {"type": "json" | "regex", "value": ...}."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise validation("`response_format` must be an object with a `type`")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise validation("`response_format.json_schema` must be an object with a `schema` object")
        schema = spec.get("schema") or {"type": "object"}
        check_json_schema(schema, "response_format.json_schema.schema")
        return {"type": "json", "value": schema}
    if kind in ("json", "regex"):
        if "value" not in response_format:
            raise validation(f"`response_format.value` is required for type {kind}")
        if kind == "json":
            check_json_schema(response_format["value"], "response_format.value")
        return {"type": kind, "value": response_format["value"]}
    raise validation(f"`response_format.type` must be one of text, json_object, json_schema, json, regex. "
                     f"Given: {kind!r:.50}")
