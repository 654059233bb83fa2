"""Bounded bodies: the size cap before and while reading, and JSON with a depth cap."""

from __future__ import annotations

import re

import httpx
import pytest
from starlette.responses import JSONResponse

from tgi_llm.gateway.body import BadJson, BodyLimit, PayloadTooLarge, check_json, load_json


async def echo_length(scope, receive, send) -> None:
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await JSONResponse({"size": size})(scope, receive, send)


def too_large(exc: PayloadTooLarge):
    return JSONResponse({"error": str(exc)}, status_code=413)


@pytest.fixture
def client():
    transport = httpx.ASGITransport(app=BodyLimit(echo_length, 1000, too_large))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def _post(client, content, headers=None):
    async with client:
        return await client.post("/", content=content, headers=headers or {})


@pytest.mark.parametrize("size", [0, 999, 1000])
def test_a_body_up_to_the_limit_passes(client, size):
    import asyncio

    r = asyncio.run(_post(client, b"x" * size))
    assert r.status_code == 200 and r.json() == {"size": size}


def test_a_declared_length_over_the_limit_is_refused_before_reading(client):
    import asyncio

    r = asyncio.run(_post(client, b"x" * 1001))
    assert r.status_code == 413
    assert "at most 1000 bytes" in r.json()["error"]


def test_a_chunked_body_is_refused_once_it_passes_the_limit(client):
    import asyncio

    async def chunks():
        for _ in range(5):
            yield b"x" * 300

    r = asyncio.run(_post(client, chunks()))  # no Content-Length: counted while read
    assert r.status_code == 413


def test_json_depth_is_checked_without_recursion():
    check_json({"a": [1, {"b": []}]}, max_depth=4)
    with pytest.raises(BadJson, match="nested deeper than 3"):
        check_json({"a": [1, {"b": []}]}, max_depth=3)
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(BadJson, match="nested deeper than 32"):
        check_json(deep)


@pytest.mark.parametrize("body, field", [
    (b'{"parameters": {"temperature": NaN}}', "parameters.temperature"),
    (b'{"top_p": Infinity}', "top_p"),
    (b'[1, -Infinity]', "1"),
    (b'{"a": {"b": [0.5, 1e999]}}', "a.b.1"),
    (b'NaN', "body"),
])
def test_load_json_refuses_non_finite_numbers_naming_where(body, field):
    with pytest.raises(BadJson, match=f"`{re.escape(field)}` must be a finite number"):
        load_json(body)


@pytest.mark.parametrize("body, field", [
    (b'{"inputs": "a\\ud800b"}', "inputs"),
    (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages.0.content"),
    (b'{"stop": ["ok", "\\ud83d"]}', "stop.1"),
])
def test_load_json_refuses_lone_surrogates_naming_where(body, field):
    with pytest.raises(BadJson, match=f"`{re.escape(field)}` holds a lone UTF-16 surrogate"):
        load_json(body)


def test_a_key_with_a_lone_surrogate_is_refused_naming_its_object():
    with pytest.raises(BadJson, match="^a key of `parameters` holds a lone UTF-16 surrogate"):
        load_json(b'{"parameters": {"\\ud800": 1}}')
    # Python's parser reads an encoded surrogate (invalid UTF-8) as a lone surrogate: the message stays text.
    with pytest.raises(BadJson, match="^a key of `body` holds a lone UTF-16 surrogate") as info:
        load_json(b'{"\xed\xa0\x80": NaN}')
    str(info.value).encode("utf-8")


def test_an_empty_key_is_named_as_such():
    with pytest.raises(BadJson, match='^`a."".0` must be a finite number'):
        load_json(b'{"a": {"": [NaN]}}')


def test_load_json_keeps_valid_unicode_and_surrogate_pairs():
    assert load_json(b'{"t": "\\ud83d\\ude00 caf\xc3\xa9"}') == {"t": "\U0001f600 caf\u00e9"}


def test_load_json_refuses_deep_nesting_and_says_why():
    assert load_json(b'{"a": [[1]]}') == {"a": [[1]]}
    with pytest.raises(BadJson, match="nested deeper than 32"):
        load_json(b"[" * 33 + b"]" * 33)
    with pytest.raises(BadJson, match="nested deeper than 32"):
        load_json(b"[" * 1_000_000 + b"]" * 1_000_000)  # Python's own recursion limit, caught
    with pytest.raises(BadJson, match="not valid JSON"):
        load_json(b'{"a": 1')
    with pytest.raises(BadJson, match="not valid JSON"):
        load_json(b"\xff\xfe")
