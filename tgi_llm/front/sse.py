"""Server-sent events, and tying a request's life to its client's connection.

A client that goes away must cancel its Triton request at once (its KV blocks come back), also while the
model is still queued or prefilling and nothing is being sent: so the response watches for the disconnect
itself instead of waiting for a failed send.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tgi_llm.front.errors import FrontError
from tgi_llm.gateway.disconnect import until_disconnect as run_until_disconnect

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def event(data: Any) -> bytes:
    """One SSE event: `data: ` then compact JSON. TGI's axum router writes no space after the colon; strict
    parsers (genai-perf's) expect one, and every SSE parser strips one, so TGI's clients read both."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


def error_event(err: FrontError, openai: bool = False) -> bytes:
    return event(err.openai_body() if openai else err.body())


class SSEResponse(StreamingResponse):
    """A text/event-stream response that closes its body iterator (and so the Triton request) as soon as
    the client disconnects, whatever the iterator is waiting for."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], **kwargs: Any) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **kwargs.pop("headers", {})}
        super().__init__(content, headers=headers, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()

            group.start_soon(watch)
            try:
                await self.stream_response(send)
            except OSError:  # the client went away mid-send
                pass
            finally:
                with anyio.CancelScope(shield=True):
                    await self.body_iterator.aclose()  # type: ignore[attr-defined]
                group.cancel_scope.cancel()


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (the body must already be read)."""
    task = await run_until_disconnect(request.receive, work)
    if task.cancelled():
        raise FrontError("Client disconnected", "cancelled")
    return task.result()
