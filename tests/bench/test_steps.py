"""Per-step engine timings grouped by method and batch size."""

from __future__ import annotations

import pytest

from tgi_llm.bench.steps import find, forward_totals, group_steps
from tgi_llm.engine.stats import StepStats


def step(method, batch, forward, bookkeeping):
    return StepStats(method=method, batch_size=batch, num_tokens=batch, num_prefill=0, forward_s=forward,
                     bookkeeping_s=bookkeeping)


def test_groups_by_method_and_batch_with_medians_and_summed_share():
    steps = [step("decode", 32, 0.10, 0.001), step("decode", 32, 0.30, 0.029), step("decode", 32, 0.20, 0.002),
             step("decode", 8, 0.05, 0.0), step("prefill", 32, 1.0, 0.1)]
    groups = group_steps(steps)
    assert [(g.method, g.batch_size, g.steps) for g in groups] == [("decode", 8, 1), ("decode", 32, 3),
                                                                   ("prefill", 32, 1)]
    d32 = find(groups, "decode", 32)
    assert d32.forward_p50_s == pytest.approx(0.20)
    assert d32.bookkeeping_p50_s == pytest.approx(0.002)
    assert d32.step_p50_s == pytest.approx(0.202)
    assert d32.bookkeeping_share == pytest.approx(0.032 / 0.632)  # sums, not a mean of ratios
    assert find(groups, "decode", 16) is None


def test_forward_totals_per_method_weigh_every_step():
    totals = forward_totals(group_steps([step("decode", 1, 0.1, 0.0), step("decode", 4, 0.3, 0.0),
                                         step("decode", 4, 0.2, 0.0), step("prefill", 2, 1.0, 0.0)]))
    assert totals["decode"]["steps"] == 3
    assert totals["decode"]["forward_mean_s"] == pytest.approx(0.2)
    assert totals["prefill"]["forward_s"] == pytest.approx(1.0)


def test_collector_drains_while_the_run_goes_on_and_keeps_every_step():
    import time
    from collections import deque

    from tgi_llm.bench.steps import StepCollector

    buffer: deque = deque()
    drains: list[int] = []

    def drain():
        out = list(buffer)
        buffer.clear()
        drains.append(len(out))
        return out

    with StepCollector(drain, interval_s=0.001) as collected:
        for i in range(40):
            buffer.append(step("decode", 1, float(i), 0.0))
            if i % 10 == 9:  # like an engine whose buffer must not overflow: wait for the drain
                deadline = time.monotonic() + 10
                while buffer and time.monotonic() < deadline:
                    time.sleep(0.001)
    assert [s.forward_s for s in collected.steps] == [float(i) for i in range(40)]
    assert sum(1 for n in drains if n) >= 4  # drained during the run, not only at the end
