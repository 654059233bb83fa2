"""`--shard-hosts`: the hosts MPI places shard ranks 1..N-1 on, and `--shard-master-addr`, where they reach rank 0.

Torch-free and MPI-free: the launcher and `EngineOptions` validate with it before anything starts. Rank 0 is the
model process (Triton's stub) on this host; it is never in the list. MPICH's process manager (hydra) honours
two `MPI_Comm_spawn` info keys for placement (`src/pm/hydra/mpiexec/pmiserv_spawn.c`): `hostfile`, a file it
parses like `mpiexec -f`, and `host`/`hosts`, a comma-separated `host[:slots]` list. Either way it fills each
host's slots in order, and wraps around when there are more ranks than slots; the check below refuses that.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: A host name or IPv4 address. Hydra splits `host:slots` at the first colon, so IPv6 addresses cannot be given.
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: Hydra's own per-host tokens after `host[:slots]` on a hostfile line (HYDU_process_mfile_token).
_HOSTFILE_TOKENS = ("user", "binding")


@dataclass(frozen=True)
class HostSlots:
    host: str
    slots: int = 1


@dataclass(frozen=True)
class ShardHosts:
    """Where shard ranks go, as parsed from `--shard-hosts`."""

    hosts: tuple[HostSlots, ...]
    hostfile: str | None = None  # absolute path when the value named a file: hydra reads the file itself

    @property
    def slots(self) -> int:
        return sum(h.slots for h in self.hosts)

    def spawn_info(self, wdir: str) -> dict[str, str]:
        """The MPI_Comm_spawn info: the placement, and a working directory that exists on every host (hydra
        starts remote ranks in the spawner's own directory otherwise, and fails where it is missing)."""
        if self.hostfile is not None:
            return {"hostfile": self.hostfile, "wdir": wdir}
        return {"host": ",".join(f"{h.host}:{h.slots}" for h in self.hosts), "wdir": wdir}


def _host_slots(entry: str, where: str) -> HostSlots:
    host, colon, slots = entry.partition(":")
    if not _HOST.fullmatch(host):
        raise ValueError(f"`shard_hosts` {where}: {host!r} is not a host name or IPv4 address")
    if not colon:
        return HostSlots(host)
    if not slots.isdigit() or int(slots) < 1:
        raise ValueError(f"`shard_hosts` {where}: slots must be a whole number >= 1 (host[:slots]). Given: {entry!r}")
    return HostSlots(host, int(slots))


def _parse_hostfile(path: Path) -> tuple[HostSlots, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"`shard_hosts` hostfile {path}: cannot be read ({exc})") from None
    hosts = []
    for number, line in enumerate(text.splitlines(), start=1):
        tokens = line.split("#", 1)[0].split()  # MPICH's format: `#` starts a comment anywhere on a line
        if not tokens:
            continue
        where = f"hostfile {path} line {number}"
        hosts.append(_host_slots(tokens[0], where))
        for token in tokens[1:]:
            key, equals, value = token.partition("=")
            if key not in _HOSTFILE_TOKENS or not equals or not value:
                raise ValueError(f"`shard_hosts` {where}: MPICH's hostfile takes `host[:slots]` and optionally "
                                 f"user=NAME or binding=..., not {token!r}")
    if not hosts:
        raise ValueError(f"`shard_hosts` hostfile {path} names no host (one `host[:slots]` per line)")
    return tuple(hosts)


def parse_shard_hosts(value: str) -> ShardHosts:
    """A path to an existing MPI hostfile, or `host[:slots],host[:slots],...`. A value with a `/` must be a
    file; a bare name that is not a file in the working directory is a host."""
    value = value.strip()
    path = Path(value).expanduser()
    if path.is_file():
        return ShardHosts(_parse_hostfile(path), str(path.resolve()))
    if os.sep in value or path.exists():
        raise ValueError(f"`shard_hosts`: no MPI hostfile at {value} (a file of `host[:slots]` lines, or give "
                         "host[:slots],host[:slots] inline)")
    entries = [e.strip() for e in value.split(",")]
    if not all(entries):
        raise ValueError(f"`shard_hosts` must be host[:slots] entries separated by commas, or an MPI hostfile. "
                         f"Given: {value!r}")
    return ShardHosts(tuple(_host_slots(e, f"entry {e!r}") for e in entries))


def check_shard_hosts(shard_hosts: str | None, shard_master_addr: str | None, num_shard: int) -> ShardHosts | None:
    """Both flags against `num_shard` (ValueError naming the flag); the parsed hosts, None without the flag."""
    if shard_master_addr is not None and not shard_hosts:
        raise ValueError("`shard_master_addr` is where shards on other hosts reach this one: it needs "
                         "`shard_hosts`")
    if shard_master_addr is not None and not _HOST.fullmatch(shard_master_addr):
        raise ValueError(f"`shard_master_addr` must be a host name or IPv4 address. Given: {shard_master_addr!r}")
    if not shard_hosts:
        return None
    hosts = parse_shard_hosts(shard_hosts)
    if num_shard < 2:
        raise ValueError(f"`shard_hosts` places shard ranks 1..N-1 and needs `num_shard` > 1. Given: {num_shard}")
    if hosts.slots < num_shard - 1:
        raise ValueError(f"`shard_hosts` has {hosts.slots} slot(s) for the {num_shard - 1} shard ranks of "
                         f"`num_shard` {num_shard} (rank 0 runs on this host, in the server, and takes none): add "
                         "hosts or give them more slots (host:slots)")
    return hosts


def local_ranks(hostnames: Sequence[str]) -> list[int]:
    """Each rank's index among the ranks on its host, in rank order (`hostnames[0]` is rank 0's): on CUDA,
    the GPU it takes on that host. On one host this is the rank itself."""
    return [hostnames[:rank].count(host) for rank, host in enumerate(hostnames)]
