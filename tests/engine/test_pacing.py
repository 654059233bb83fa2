"""The step pacer: a prompt-token budget that follows the measured cost per token while streams decode."""

from __future__ import annotations

import pytest

from tgi_llm.engine.limits import LimitOptions, resolve_limits
from tgi_llm.engine.pacing import StepPacer


def test_no_target_or_no_decodes_or_no_measurement_gives_the_whole_cap():
    assert StepPacer(None).budget(512, decoding=True) == 512
    pacer = StepPacer(0.4)
    assert pacer.budget(512, decoding=True) == 512  # nothing measured yet
    pacer.observe(100, 1.0)
    assert pacer.budget(512, decoding=False) == 512  # nobody would wait for this step


def test_budget_follows_the_cost_per_token_within_the_cap_and_a_block():
    pacer = StepPacer(0.4, min_tokens=16)
    pacer.observe(200, 1.0)  # 5 ms per token
    assert pacer.budget(512, decoding=True) == 80
    pacer.observe(200, 0.2)  # the machine got faster: the average moves towards 1 ms per token
    assert 80 < pacer.budget(512, decoding=True) < 400
    pacer.observe(100, 1.0)  # dearer at once (a longer context): the next step is sized by it, 10 ms per token
    assert pacer.budget(512, decoding=True) == 40
    slow = StepPacer(0.4, min_tokens=16)
    slow.observe(64, 64.0)  # 1 s per token: still one block per step
    assert slow.budget(512, decoding=True) == 16
    assert StepPacer(10.0, seconds_per_token=0.001).budget(512, decoding=True) == 512


def test_small_steps_are_not_taken_as_measurements():
    pacer = StepPacer(0.4)
    pacer.observe(8, 1.0)  # 8 decodes: fixed costs dominate
    assert pacer.seconds_per_token is None


def test_the_target_is_the_devices_default_unless_given_and_only_with_chunking():
    assert resolve_limits(LimitOptions(), 8192, 100_000, 512, 400).prefill_step_target_ms == 400
    assert resolve_limits(LimitOptions(prefill_step_target_ms=250), 8192, 100_000, 512, 400) \
        .prefill_step_target_ms == 250
    assert resolve_limits(LimitOptions(prefill_step_target_ms=0), 8192, 100_000, 512, 400) \
        .prefill_step_target_ms is None
    assert resolve_limits(LimitOptions(prefill_chunking=False), 8192, 100_000, 512, 400) \
        .prefill_step_target_ms is None
    with pytest.raises(ValueError, match="prefill_step_target_ms"):
        resolve_limits(LimitOptions(prefill_step_target_ms=-1), 8192, 100_000)
