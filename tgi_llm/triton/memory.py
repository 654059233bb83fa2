"""Hand freed memory back to the OS when the engine goes idle (glibc's malloc_trim).

The model process's RSS rises with the largest batches it has run: each step allocates its activations
anew, glibc keeps what is freed in its heaps for the next step, and fragmentation keeps some of it from
being reused. That is a high-water mark, not a leak (docs/RELIABILITY.md: Python objects stay flat, the
curve flattens, malloc_trim returns the difference). Trimming once whenever the engine falls idle gives it
back between bursts, at no cost while requests run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tgi_llm.memory import libc_trim

logger = logging.getLogger(__name__)


class IdleTrim:
    """`observe(busy)` after each look at the engine: trims once on each busy -> idle transition."""

    def __init__(self, trim: Callable[[], int] | None = None) -> None:
        self._trim = trim if trim is not None else libc_trim()
        self._busy_since_trim = False
        self.trims = 0

    def observe(self, busy: bool) -> None:
        if busy:
            self._busy_since_trim = True
        elif self._busy_since_trim and self._trim is not None:
            self._busy_since_trim = False
            self.trims += 1
            self._trim()
