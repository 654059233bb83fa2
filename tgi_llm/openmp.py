"""Keep the engine thread the process's only OpenMP master.

libgomp gives every thread that opens a parallel region its own pool of worker threads, and once it
manages more threads than there are CPUs it cuts the time an idle worker spins before it sleeps from
~300,000 to 1,000 iterations. A forward opens a few hundred parallel regions (every GEMV, every
attention call), so then each one wakes its workers through the kernel: measured on 2 vCPUs, a batch-1
decode step took 23.8 ms on a second thread against 20.1 ms on the first (95 and 183 context switches per
step on the two threads, against 2). Loading the model opens parallel regions too (weights, kernel
self-checks), and the thread that loads keeps its pool for its life: so the loading runs on a thread of
its own that ends before the engine thread starts, whose pool is then the only one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_passing_thread(fn: Callable[[], T], name: str = "tgi-load") -> T:
    """fn() on a new thread that ends when it returns (its OpenMP pool with it); its result or exception."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised on the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
