"""MPICH's shared-memory segments (`/dev/shm/mpich_shm_*`), which only MPI_Finalize removes, and we never
finalize (launch.py says why). Each MPI process here maps a segment of its own at MPI init and nobody
opens it by name once the hand-shake is over, so each process unlinks the segments it has mapped right
after: the memory stays valid while mapped and is freed when the process exits, instead of staying in
/dev/shm (1-2 MB per process, for every start of a sharded model, until reboot).

With --shard-hosts this holds on every host: a segment lives in its own host's /dev/shm, MPICH shares memory
only among the processes of one host (across hosts it uses the network), and each process removes only the
segments it has mapped itself, read from its own /proc/self/maps."""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger("tgi_llm.parallel")

PREFIX = "/dev/shm/mpich_shm_"


def mapped_segments(maps: Path = Path("/proc/self/maps")) -> list[str]:
    try:
        lines = maps.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in lines if PREFIX in line and not line.endswith("(deleted)")})


def unlink_mapped_segments(maps: Path = Path("/proc/self/maps")) -> list[str]:
    """Unlink this process's MPICH segments; returns the paths removed."""
    removed = []
    for path in mapped_segments(maps):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError as exc:  # gone already, or not ours to remove: nothing leaks because of us
            logger.debug("could not remove %s: %s", path, exc)
    return removed
