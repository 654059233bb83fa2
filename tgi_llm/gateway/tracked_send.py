"""An ASGI `send` that records whether the response has started: once its status line is out, an error can
no longer be answered, only the connection cut."""

from __future__ import annotations

from starlette.types import Message, Send


class TrackedSend:
    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        self.started = self.started or message["type"] == "http.response.start"
        await self.send(message)
