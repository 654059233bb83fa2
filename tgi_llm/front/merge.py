"""Interleave several Triton streams (one per prompt of a /v1/completions batch) as their responses come."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")
_END = object()


async def merge_streams(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Yield (stream index, item) in arrival order. The first error ends the merge; closing the merge
    (or an error) closes every stream still open, so their Triton requests are cancelled."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item, None))
        except Exception as exc:  # handed to the consumer, which raises it
            await queue.put((index, _END, exc))
            return
        await queue.put((index, _END, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(streams)
        while open_streams:
            index, item, exc = await queue.get()
            if exc is not None:
                raise exc
            if item is _END:
                open_streams -= 1
                continue
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
