"""uvicorn's HTTP/1.1 protocol with a deadline for receiving each request.

uvicorn times out idle keep-alive connections, but not a client that sends a request slowly (or
sends half of one and stops): each such connection is held forever. Here every request, headers
and body, must arrive within `request_timeout_s` of its first byte (or of the connection opening);
otherwise the connection is closed. The response may take as long as it needs.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("tgi_llm.gateway")

#: h11 states in which the client has sent its whole request (or will send nothing more).
_RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)


class DeadlineH11Protocol(H11Protocol):
    request_timeout_s: float = 30.0

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state in _RECEIVED:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.conn.their_state in _RECEIVED or self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        logger.warning("closing the connection of %s: its request did not arrive within %.0f s", client,
                       self.request_timeout_s)
        self.transport.close()


def protocol_with_deadline(request_timeout_s: float) -> type[DeadlineH11Protocol]:
    """The protocol class to pass as uvicorn.Config(http=...)."""
    return type("DeadlineH11Protocol", (DeadlineH11Protocol,), {"request_timeout_s": float(request_timeout_s)})
