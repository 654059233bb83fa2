"""Validation workers: bounded waiting, and exactly one answer for every request, even at shutdown."""

from __future__ import annotations

import threading

from tgi_llm.errors import OverloadedError, ShutdownError
from tgi_llm.triton.admission import AdmissionPool

WAIT = 30.0  # hang guard only


def test_work_runs_off_the_calling_thread_and_waiting_is_bounded():
    rejected: list[tuple[str, BaseException]] = []
    release = threading.Event()
    ran: list[str] = []
    pool = AdmissionPool(workers=1, max_waiting=2, reject=lambda s, e: rejected.append((s, e)))
    caller = threading.current_thread()

    def work(name):
        def run():
            assert threading.current_thread() is not caller
            release.wait(WAIT)
            ran.append(name)
        return run

    pool.submit("a", work("a"))
    pool.submit("b", work("b"))  # waits for the one worker
    pool.submit("c", work("c"))  # a third while two wait: refused at once
    assert [(s, type(e)) for s, e in rejected] == [("c", OverloadedError)]
    release.set()
    for _ in range(3000):  # hang guard while both run
        if len(ran) == 2:
            break
        threading.Event().wait(0.01)
    pool.close()
    assert sorted(ran) == ["a", "b"] and len(rejected) == 1


def test_close_answers_what_never_started_with_shutdown():
    rejected: list[tuple[str, BaseException]] = []
    started, release = threading.Event(), threading.Event()
    pool = AdmissionPool(workers=1, max_waiting=10, reject=lambda s, e: rejected.append((s, e)))

    def blocking():
        started.set()
        release.wait(WAIT)

    pool.submit("running", blocking)
    assert started.wait(WAIT)
    for name in ("q1", "q2"):
        pool.submit(name, lambda: None)
    closer = threading.Thread(target=pool.close)
    closer.start()
    release.set()
    closer.join(WAIT)
    pool.submit("late", lambda: None)
    assert sorted((s, type(e)) for s, e in rejected) == [
        ("late", ShutdownError), ("q1", ShutdownError), ("q2", ShutdownError)]
