"""The Python backend's scratch directory: when it loads, tritonserver makes an empty `/tmp/python_env_XXXXXX`
(for packed execution environments, which this server does not use) and removes it only when it stops
cleanly. A tritonserver killed after a model failure leaves it behind, one per restart. The launcher notes
the directory that appears while its tritonserver starts and removes it, if still there and empty, once
that tritonserver is gone. Two that appear at once (another tritonserver starting beside ours) are not
ours to tell apart: neither is noted."""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger("tgi_llm.launcher")

#: Where the backend makes it: a fixed template in its source, not $TMPDIR.
ENV_ROOT = Path("/tmp")
ENV_PATTERN = "python_env_*"


def env_dirs(root: Path = ENV_ROOT) -> set[Path]:
    return set(root.glob(ENV_PATTERN))


def new_env_dir(before: set[Path], root: Path = ENV_ROOT) -> Path | None:
    """The one directory that appeared since `before` was listed; None if none or several did."""
    new = env_dirs(root) - before
    if len(new) > 1:
        logger.debug("several Python backend directories appeared while tritonserver started: %s", sorted(new))
    return new.pop() if len(new) == 1 else None


def remove_env_dirs(dirs: list[Path]) -> list[Path]:
    """Remove those of `dirs` still present and empty; returns the ones removed."""
    removed = []
    for path in dirs:
        try:
            path.rmdir()
        except FileNotFoundError:
            continue
        except OSError as exc:  # not empty: not the directory we noted, leave it
            logger.warning("left %s in place: %s", path, os.strerror(exc.errno or 0))
            continue
        removed.append(path)
    if removed:
        logger.info("removed the Python backend directory left by tritonserver: %s", ", ".join(map(str, removed)))
    return removed
