"""The Python backend's shared-memory regions: tritonserver unlinks a stub's region when it unloads the
model, not when the stub dies or tritonserver is killed. The launcher remembers the regions of the stubs
it saw and removes what is left after tritonserver is gone."""

from __future__ import annotations

import logging
from pathlib import Path

from tgi_llm.procfs import cmdline

logger = logging.getLogger("tgi_llm.launcher")

SHM_DIR = Path("/dev/shm")
REGION_PREFIX = "triton_python_backend_shm_region_"


def stub_regions(pids: list[int]) -> list[str]:
    """The region each stub was started with (its second argument: `stub model.py <region> ...`)."""
    regions = []
    for pid in pids:
        argv = cmdline(pid)
        regions += [a for a in argv[1:3] if a.startswith(REGION_PREFIX) and "/" not in a]
    return regions


def remove_regions(regions: list[str], shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink those of `regions` still present; returns the ones removed."""
    removed = []
    for name in regions:
        path = shm_dir / name
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.warning("could not remove shared memory %s: %s", path, exc)
            continue
        removed.append(name)
    if removed:
        logger.info("removed the shared memory left by tritonserver: %s", ", ".join(removed))
    return removed
