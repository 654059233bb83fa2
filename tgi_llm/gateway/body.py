"""Bounded request bodies: a size cap enforced before and while reading, and JSON with a depth cap.

TGI's `--payload-limit` (2 MB by default) applies to every HTTP entry point: the TGI/OpenAI front and
the gateway in front of Triton's HTTP ports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tgi_llm.gateway.tracked_send import TrackedSend

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
        tracked = TrackedSend(send)
        try:
            await self.app(scope, limited_receive(receive, self.limit), tracked)
        except PayloadTooLarge as exc:
            if tracked.started:
                raise
            await drain(receive)
            await self.too_large(exc)(scope, receive, send)


def load_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse `raw`; BadJson (with the reason) when it is not UTF-8 JSON, nests deeper than `max_depth`, or holds
    what strict JSON parsers (serde_json, TGI's) refuse and Python's accepts: NaN, Infinity, numbers past a
    double's range and lone UTF-16 surrogates. The message names where (`messages.0.content`)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BadJson(f"JSON body nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise BadJson(f"the request body is not valid JSON: {exc}") from None
    check_json(value, max_depth)
    return value


def check_json(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """BadJson unless `value` nests at most `max_depth` deep and holds only finite numbers and strings
    that encode as UTF-8. Iterative: a deep value must not recurse."""
    _check_scalar(value, ())
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            children = item.items()
        elif isinstance(item, list):
            children = enumerate(item)
        else:
            continue
        if len(path) >= max_depth:
            raise BadJson(f"JSON body nested deeper than {max_depth} levels (in `{_where(path[:1])}`)")
        for key, child in children:
            if isinstance(key, str) and not _encodes(key):  # before its value's check, whose message names it
                raise BadJson(f"a key of `{_where(path)}` holds a lone UTF-16 surrogate, which is not valid Unicode")
            if isinstance(child, (dict, list)):
                stack.append((child, (*path, key)))
            else:  # the path is built only for an error: a list of 100,000 token ids stays cheap
                _check_scalar(child, path, key)


def _check_scalar(item: Any, path: tuple[Any, ...], key: Any = None) -> None:
    if isinstance(item, float) and not math.isfinite(item):
        raise BadJson(f"`{_where(path, key)}` must be a finite number. Given: {item}")
    if isinstance(item, str) and not _encodes(item):
        raise BadJson(f"`{_where(path, key)}` holds a lone UTF-16 surrogate, which is not valid Unicode")


def _encodes(text: str) -> bool:
    """Whether `text` is valid Unicode (encodes as UTF-8): not when it holds a lone surrogate."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _where(path: tuple[Any, ...], key: Any = None) -> str:
    parts = path if key is None else (*path, key)
    return ".".join(str(part) or '""' for part in parts) or "body"
