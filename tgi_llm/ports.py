"""Free TCP ports on 127.0.0.1 (tests, the benchmark, and the launcher's loopback-only tritonserver)."""

from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """n distinct free ports (all bound at once, so none is handed out twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
