"""uvicorn with the request deadline: slow or stalled clients are disconnected, normal ones are served."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.responses import PlainTextResponse

from tgi_llm.gateway.deadline import protocol_with_deadline

TIMEOUT_S = 0.5


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await PlainTextResponse(f"got {len(body)}")(scope, receive, send)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=protocol_with_deadline(TIMEOUT_S), log_level="error",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        thread.join(0.05)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)


def closed_after(conn: socket.socket, limit_s: float = 10.0) -> float:
    """Seconds until the server closes `conn` (hang guard `limit_s`); a reset is a close too."""
    start = time.monotonic()
    conn.settimeout(limit_s)
    try:
        while conn.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def trickled_until_closed(conn: socket.socket, every_s: float, limit_s: float) -> float:
    """Send a header line every `every_s` until the server closes `conn`; seconds that took (inf past `limit_s`)."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        try:
            conn.sendall(b"X-Slow: 1\r\n")
            readable, _, _ = select.select([conn], [], [], every_s)
            if readable and not conn.recv(4096):
                return time.monotonic() - start
        except (BrokenPipeError, ConnectionResetError):  # closed while we were writing
            return time.monotonic() - start
    return float("inf")


def test_a_connection_that_sends_nothing_is_closed(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        assert closed_after(conn) < TIMEOUT_S + 3


def test_headers_that_never_end_are_closed(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n")
        # A byte every third of the deadline would hold the connection forever if bytes extended it.
        assert trickled_until_closed(conn, every_s=TIMEOUT_S / 3, limit_s=TIMEOUT_S * 20) < TIMEOUT_S + 3


def test_a_body_that_never_ends_is_closed(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten b")
        assert closed_after(conn) < TIMEOUT_S + 3


def test_requests_that_arrive_in_time_are_served_on_a_kept_alive_connection(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        for _ in range(3):
            conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
            conn.settimeout(10)
            reply = b""
            while not reply.endswith(b"got 3"):
                chunk = conn.recv(4096)
                assert chunk, f"closed after {reply!r}"
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 200")
            time.sleep(TIMEOUT_S * 0.6)  # idle between requests, each request itself in time
