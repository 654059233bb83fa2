"""Turn an engine that died (loop crash, shard failure) into a model that is no longer ready."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class HealthWatchdog:
    """Calls `on_unhealthy` once, from its own thread, when `healthy()` first returns False."""

    def __init__(self, healthy: Callable[[], bool], on_unhealthy: Callable[[], None], poll_s: float = 0.5) -> None:
        self._healthy = healthy
        self._on_unhealthy = on_unhealthy
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tgi-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            if not self._healthy():
                logger.error("the engine is no longer healthy: taking the model out of service")
                self._on_unhealthy()
                return
