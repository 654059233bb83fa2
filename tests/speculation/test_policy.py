"""Draft lengths and the break-even acceptance: a sequence guesses more after full acceptance and less
after a rejection; an extra row pays at a lower acceptance the fewer sequences share the step; the step
cost model is fitted from measured steps."""

from __future__ import annotations

import pytest

from tgi_llm.speculation import DraftLength, SpeculationPolicy
from tgi_llm.speculation.policy import PRIOR_ACCEPTANCE


def test_a_draft_length_starts_at_the_limit_grows_on_full_acceptance_and_falls_on_rejection():
    d = DraftLength(limit=4)
    assert d.current == 4
    d.observe(4, 1)  # the second guess was wrong: next time one past what was right
    assert d.current == 2
    d.observe(2, 2)
    assert d.current == 3
    d.observe(3, 3)
    d.observe(4, 4)
    assert d.current == 4  # capped at the limit
    d.observe(4, 0)
    assert d.current == 1  # never below one
    d.observe(1, 0)
    assert d.current == 1


def test_acceptance_follows_verified_steps_and_drifts_back_while_not_guessing():
    d = DraftLength(limit=4)
    assert d.acceptance == PRIOR_ACCEPTANCE
    d.observe(4, 4)
    high = d.acceptance
    assert PRIOR_ACCEPTANCE < high <= 1.0
    d.observe(0, 0)  # no guesses: nothing observed
    assert d.acceptance == high and d.current == 4
    for _ in range(10):
        d.observe(4, 0)
    low = d.acceptance
    assert 0.0 <= low < 0.1
    for _ in range(10):
        d.skipped()
    assert low < d.acceptance < PRIOR_ACCEPTANCE  # tries again later, without jumping to the prior


def test_break_even_rises_with_batch_size_and_is_small_for_one_stream_under_the_prior():
    policy = SpeculationPolicy(limit=4)
    assert policy.enabled and not SpeculationPolicy(limit=0).enabled
    levels = [policy.break_even(b) for b in (1, 2, 4, 8, 32, 256)]
    assert levels == sorted(levels) and len(set(levels)) == len(levels)
    assert levels[0] <= 0.2  # one stream: nearly any guess pays
    assert levels[-1] < 1.0 and levels[-1] > 0.9  # a big batch: only near-certain guesses pay


def test_row_cost_recovers_a_linear_step_cost():
    """Steps that cost 10 ms + 1 ms per row, over varied row counts: the fit finds t0 and t1, and the
    break-even follows from them (B t1 / (t0 + B t1))."""
    policy = SpeculationPolicy(limit=4)
    for i in range(300):
        rows = 1 + (i * 7) % 40
        policy.observe(rows, 0.010 + 0.001 * rows)
    t0, t1 = policy.row_cost()
    assert t0 == pytest.approx(0.010, rel=0.05)
    assert t1 == pytest.approx(0.001, rel=0.05)
    assert policy.break_even(1) == pytest.approx(1 / 11, rel=0.1)
    assert policy.break_even(30) == pytest.approx(30 / 40, rel=0.05)


def test_the_fit_follows_a_machine_that_changes():
    policy = SpeculationPolicy(limit=4)
    for i in range(200):
        rows = 1 + i % 16
        policy.observe(rows, 0.010 + 0.001 * rows)
    for i in range(600):  # later steps: a slower fixed cost, cheaper rows
        rows = 1 + i % 16
        policy.observe(rows, 0.020 + 0.0002 * rows)
    t0, t1 = policy.row_cost()
    assert t0 == pytest.approx(0.020, rel=0.05)
    assert t1 == pytest.approx(0.0002, rel=0.1)


def test_equal_sized_steps_and_bad_measurements_give_a_usable_fit():
    """Steps that all have the same rows cannot separate t0 from t1: the prior keeps the fit finite and
    positive; steps without rows or time are ignored."""
    policy = SpeculationPolicy(limit=4)
    policy.observe(0, 0.5)
    policy.observe(3, 0.0)
    policy.observe(3, -1.0)
    assert policy.row_cost() == SpeculationPolicy(limit=4).row_cost()  # nothing was measured
    for _ in range(50):
        policy.observe(4, 0.012)
    t0, t1 = policy.row_cost()
    assert t0 > 0 and t1 >= 0
    assert t0 + 4 * t1 == pytest.approx(0.012, rel=1e-6)  # the fit goes through the measured steps
    assert 0 < policy.break_even(1) < policy.break_even(8) < 1
