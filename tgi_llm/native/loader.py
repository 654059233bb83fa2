"""The kernels library, loaded once per process, and the registry of kernel families made from it.

The library is built (or found in the cache), loaded, its signatures bound and its structs checked against
their Python mirrors once per process. Each family of kernels (the linears, attention, the layer stack)
registers how to make it from the library and how to check it against the torch reference; it is decided
once per process, and logged once: None where switched off, not buildable, or wrong, and the torch path serves.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from tgi_llm.native.abi import bind, check_abi
from tgi_llm.native.build import build_library

logger = logging.getLogger(__name__)

LIBRARY_NAME = "tgi_kernels"
T = TypeVar("T")

_lock = threading.Lock()
#: The loaded library, or why it could not be had (None: not tried yet in this process).
_outcome: ctypes.CDLL | Exception | None = None


def library_path() -> Path:
    """This CPU's build of the kernels (compiled once per machine, build.py)."""
    return build_library(LIBRARY_NAME)


def load(path: Path) -> ctypes.CDLL:
    """A build of the kernels, its signatures bound and its structs checked (AbiMismatch where they differ)."""
    lib = bind(ctypes.CDLL(str(path)))
    check_abi(lib)
    return lib


def library() -> ctypes.CDLL:
    """The kernels for this process, loaded on first use; the first failure is raised again to later callers."""
    global _outcome
    with _lock:
        if _outcome is None:
            try:
                _outcome = load(library_path())
            except Exception as exc:
                _outcome = exc
        if isinstance(_outcome, Exception):
            raise _outcome
        return _outcome


class CheckedKernels(Generic[T]):
    """One family of kernels: `make` builds its Python face from the library, `check` compares it with the torch
    reference (raising where it disagrees) and returns what the log says about it. Call to get it (or None)."""

    def __init__(self, what: str, switch: str, enabled: Callable[[], bool], make: Callable[[ctypes.CDLL], T],
                 check: Callable[[T], str]) -> None:
        self.what, self.switch, self.enabled, self.make, self.check = what, switch, enabled, make, check
        #: Whether this process has decided (then `value` is the answer): tests reset it to decide again.
        self.decided = False
        self.value: T | None = None
        self._lock = threading.Lock()
        REGISTRY.append(self)

    def __call__(self) -> T | None:
        if not self.decided:
            with self._lock:
                if not self.decided:
                    self.value = self._decide()
                    self.decided = True
        return self.value

    def _decide(self) -> T | None:
        if not self.enabled():
            logger.info("%s: torch path (C kernels switched off by %s=0)", self.what, self.switch)
            return None
        try:
            kernels = self.make(library())
            note = self.check(kernels)
        except Exception as exc:  # an optional fast path: whatever went wrong, serve with torch
            logger.warning("%s: torch path, the C kernels are unavailable (pid %d): %s", self.what, os.getpid(), exc)
            return None
        logger.info("%s: %s (pid %d)", self.what, note, os.getpid())
        return kernels


#: Every family, in the order their modules were imported.
REGISTRY: list[CheckedKernels] = []
