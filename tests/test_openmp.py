"""The model loads on a thread that is gone before the engine's starts (tgi_llm/openmp.py)."""

from __future__ import annotations

import threading

import pytest

from tgi_llm.engine import builder
from tgi_llm.engine.options import EngineOptions
from tgi_llm.openmp import on_passing_thread


def test_runs_on_another_thread_that_ends_and_returns_the_result():
    seen = []

    def fn():
        seen.append(threading.current_thread())
        return 42

    assert on_passing_thread(fn) == 42
    (thread,) = seen
    assert thread is not threading.current_thread() and not thread.is_alive()


def test_the_exception_reaches_the_caller():
    def fn():
        raise ValueError("bad weights")

    with pytest.raises(ValueError, match="bad weights"):
        on_passing_thread(fn)


def test_build_engine_loads_off_the_callers_thread(monkeypatch):
    loaded_on = []
    monkeypatch.setattr(builder, "_build_engine", lambda opts: loaded_on.append(threading.current_thread()) or "engine")
    assert builder.build_engine(EngineOptions()) == "engine"
    assert loaded_on[0] is not threading.current_thread() and not loaded_on[0].is_alive()
