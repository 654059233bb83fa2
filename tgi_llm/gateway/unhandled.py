"""The one error path for an HTTP request whose app raised: shared by the gateway and the TGI/OpenAI front.

uvicorn would log ~80 lines of traceback and answer in plain text. Here the exception is reported in one
line (each caller words it) and answered as the caller's API answers errors, unless the response had already
started: then nothing can be sent, and uvicorn closes the connection when the app returns unfinished.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from tgi_llm.gateway.body import PayloadTooLarge
from tgi_llm.gateway.tracked_send import TrackedSend


class UnhandledErrors:
    """ASGI middleware: an exception from `app` on an HTTP request is passed to `report(scope, exc)` and, while
    nothing was sent, answered by `answer(scope, exc)`. PayloadTooLarge goes on to BodyLimit, outside."""

    def __init__(self, app: ASGIApp, answer: Callable[[Scope, Exception], ASGIApp],
                 report: Callable[[Scope, Exception], None]) -> None:
        self.app, self.answer, self.report = app, answer, report

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = TrackedSend(send)
        try:
            await self.app(scope, receive, tracked)
        except PayloadTooLarge:
            raise
        except Exception as exc:
            self.report(scope, exc)
            if not tracked.started:
                await self.answer(scope, exc)(scope, receive, send)
