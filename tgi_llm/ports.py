"""Free TCP ports on 127.0.0.1 (tests, the benchmark, and the launcher's loopback-only tritonserver).

A port is drawn now and bound later by another process (tritonserver binds its HTTP and gRPC ports only
after loading the model, and loading it spawns MPI ranks). Ports are therefore drawn below the kernel's
ephemeral range: every bind to port 0 and every outgoing connection takes its port from that range, so a
port released there could be taken in between (CI: tritonserver's gRPC port "already in use" after the
shards of `--num-shard 2` started). Below it, only a process that names the port can take it.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection, Sequence
from pathlib import Path

#: Linux's default ephemeral range starts here; read from the kernel where it says otherwise.
DEFAULT_EPHEMERAL_LOW = 32768
#: The lowest port drawn: above the well-known and most registered services' ports.
LOWEST_PORT = 10000


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (net.ipv4.ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def _bind(port: int) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    return s


def free_ports(n: int, exclude: Collection[int] = ()) -> list[int]:
    """n distinct free ports below the ephemeral range (all bound at once while drawing, so none is handed
    out twice), none of them in `exclude` (ports already promised to a listener that has not bound them
    yet). Where that range leaves too little room below it, ports come from the kernel (port 0)."""
    socks: list[socket.socket] = []
    try:
        high = ephemeral_low()
        if high - LOWEST_PORT >= 1000:
            draw = random.SystemRandom()  # not the tests' seeded generator: two runs must not draw alike
            for _ in range(50 * n):
                if len(socks) == n:
                    break
                port = draw.randrange(LOWEST_PORT, high)
                if port not in exclude and (s := _bind(port)) is not None:
                    socks.append(s)
        while len(socks) < n:
            s = _bind(0)
            if s is None:
                raise OSError("no free port on 127.0.0.1")
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
