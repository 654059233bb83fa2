"""Validation (tokenization included) on a few worker threads, off Triton's execute thread.

Triton calls `execute` for one request at a time per model instance: a prompt that takes long to
tokenize there stalls every request behind it. `execute` now only reads the tensors; these workers
(TGI's --validation-workers) tokenize, validate and submit to the engine. Each request still gets
exactly one final response: refused when too many wait for a worker, and a ShutdownError for those
still waiting when the model stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tgi_llm.errors import OverloadedError, ShutdownError

logger = logging.getLogger(__name__)


class AdmissionPool:
    def __init__(self, workers: int, max_waiting: int, reject: Callable[[Any, BaseException], None]) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="tgi-validation")
        self._max_waiting = max_waiting
        self._reject = reject
        self._lock = threading.Lock()
        self._waiting: dict[Future, Any] = {}  # not yet started or running: future -> its request's sender
        self._closed = False

    def submit(self, sender: Any, work: Callable[[], None]) -> None:
        """Run `work` on a worker; `sender` gets an error at once if that is not possible."""
        future: Future | None = None
        with self._lock:
            if self._closed:
                error: BaseException | None = ShutdownError()
            elif len(self._waiting) >= self._max_waiting:
                error = OverloadedError()
            else:
                error = None
                future = self._pool.submit(work)
                self._waiting[future] = sender
        if future is not None:
            future.add_done_callback(self._done)  # outside the lock: it runs at once if `work` already ended
        if error is not None:
            self._reject(sender, error)

    def _done(self, future: Future) -> None:
        with self._lock:
            sender = self._waiting.pop(future, None)
        if future.cancelled():
            self._reject(sender, ShutdownError())
        elif future.exception() is not None:  # `work` answers its own request; this is a bug
            logger.error("admission crashed", exc_info=future.exception())

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        """Refuse new work, cancel what has not started (each gets ShutdownError), finish what has."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
