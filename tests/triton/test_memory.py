"""Freed memory goes back to the OS once per busy -> idle transition, never while requests run."""

from __future__ import annotations

from tgi_llm.memory import libc_trim
from tgi_llm.triton.memory import IdleTrim


def test_trims_once_each_time_the_engine_falls_idle():
    calls = []
    trim = IdleTrim(lambda: calls.append(1) or 1)
    for busy in (False, True, True, False, False, True, False):
        trim.observe(busy)
    assert len(calls) == trim.trims == 2  # after each burst, not at start, not twice in a row


def test_glibc_malloc_trim_is_found_and_callable():
    trim = libc_trim()
    assert trim is not None and trim() in (0, 1)  # Linux with glibc, as the server runs
