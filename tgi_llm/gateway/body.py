"""Bounded request bodies: a size cap enforced before and while reading, and JSON with a depth cap.

TGI's `--payload-limit` (2 MB by default) applies to every HTTP entry point: the TGI/OpenAI front and
the gateway in front of Triton's HTTP ports.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: TGI's --payload-limit default.
DEFAULT_PAYLOAD_LIMIT = 2_000_000
#: Deeper JSON is refused before anything else reads it (Triton's parser recurses once per level).
MAX_JSON_DEPTH = 32


class PayloadTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"Payload too large: the request body must be at most {limit} bytes (--payload-limit)")
        self.limit = limit


class BadJson(ValueError):
    """The body is not JSON we accept; the message says why."""


def declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def limited_receive(receive: Receive, limit: int) -> Receive:
    """`receive` that raises PayloadTooLarge as soon as the body read so far passes `limit` bytes."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise PayloadTooLarge(limit)
        return message

    return wrapped


#: A refused body is read (and dropped) up to this much before the 413 goes out: a server that answers and
#: closes while the client still sends makes the client's TCP stack see a reset, not the 413.
DRAIN_LIMIT = 64 * 1024 * 1024


async def drain(receive: Receive, limit: int = DRAIN_LIMIT) -> None:
    """Read the rest of a body without keeping it, up to `limit` bytes (the request deadline bounds the time)."""
    seen = 0
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class BodyLimit:
    """ASGI middleware: a body over `limit` bytes gets `too_large(limit)` (a 413 response), refused from
    its Content-Length when it declares one, else when the bytes read pass the limit."""

    def __init__(self, app: ASGIApp, limit: int, too_large: Callable[[PayloadTooLarge], ASGIApp]) -> None:
        self.app = app
        self.limit = limit
        self.too_large = too_large

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = declared_length(scope)
        if length is not None and length > self.limit:
            await drain(receive)
            await self.too_large(PayloadTooLarge(self.limit))(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive(receive, self.limit), tracking_send)
        except PayloadTooLarge as exc:
            if started:
                raise
            await drain(receive)
            await self.too_large(exc)(scope, receive, send)


def load_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse `raw`; BadJson (with the reason) when it is not UTF-8 JSON or nests deeper than `max_depth`."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BadJson(f"JSON body nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise BadJson(f"the request body is not valid JSON: {exc}") from None
    if json_depth(value) > max_depth:
        raise BadJson(f"JSON body nested deeper than {max_depth} levels")
    return value


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
