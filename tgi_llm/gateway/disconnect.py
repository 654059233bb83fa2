"""Tie work to an HTTP client's connection: when the client goes away first, the work is cancelled (a
Triton request upstream is then cancelled, and its KV blocks come back). The gateway's proxy and the front
both answer through it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

T = TypeVar("T")


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> asyncio.Future[T]:
    """Run `work` until it ends or the client disconnects (the request body is already read), whichever
    comes first; returns its task, done, or cancelled when the client went away first."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # let the work's cleanup (a Triton cancel) run before the caller answers
    return task
