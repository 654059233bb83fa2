"""Free TCP ports on 127.0.0.1 (tests, the benchmark, and the launcher's loopback-only tritonserver)."""

from __future__ import annotations

import socket
from collections.abc import Collection, Sequence


def free_ports(n: int, exclude: Collection[int] = ()) -> list[int]:
    """n distinct free ports (all bound at once, so none is handed out twice), none of them in `exclude`
    (ports already promised to a listener that has not bound them yet)."""
    socks: list[socket.socket] = []
    try:
        while len(socks) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            if s.getsockname()[1] in exclude:
                n += 1  # keep it bound so it is not drawn again; drop it from the answer
        return [p for p in (s.getsockname()[1] for s in socks) if p not in exclude]
    finally:
        for s in socks:
            s.close()


def promised_ports(flags: Sequence[str]) -> set[int]:
    """The ports a launcher command line names (`--port N`, `--http-port N`...): chosen, not bound yet."""
    return {int(value) for flag, value in zip(flags, flags[1:], strict=False)
            if flag.startswith("--") and flag.endswith("port") and value.isdigit()}
