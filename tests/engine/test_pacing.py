"""The step pacer: a prompt-token budget that follows the measured cost per token while streams decode."""

from __future__ import annotations

import pytest

from tgi_llm.engine.limits import LimitOptions, resolve_limits
from tgi_llm.engine.pacing import StepPacer


def test_no_target_or_no_decodes_or_no_measurement_gives_the_whole_cap():
    assert StepPacer(None).prompt_budget(512, decoding=True) == 512
    pacer = StepPacer(0.4)
    assert pacer.prompt_budget(512, decoding=True) == 512  # nothing measured yet
    pacer.observe(100, 0, 1.0)
    assert pacer.prompt_budget(512, decoding=False) == 512  # nobody would wait for this step


def test_budget_follows_the_cost_per_prompt_token_within_the_cap_and_a_block():
    pacer = StepPacer(0.4, min_tokens=16)
    pacer.observe(200, 0, 1.0)  # 5 ms per token
    assert pacer.prompt_budget(512, decoding=True) == 80
    pacer.observe(200, 0, 0.2)  # the machine got faster: the average moves towards 1 ms per token
    assert 80 < pacer.prompt_budget(512, decoding=True) < 400
    pacer.observe(100, 0, 1.0)  # dearer at once (a longer context): the next step is sized by it, 10 ms per token
    assert pacer.prompt_budget(512, decoding=True) == 40
    slow = StepPacer(0.4, min_tokens=16)
    slow.observe(64, 0, 64.0)  # 1 s per token: still one block per step
    assert slow.prompt_budget(512, decoding=True) == 16
    assert StepPacer(10.0, seconds_per_token=0.001).prompt_budget(512, decoding=True) == 512


def test_what_decoding_costs_is_not_charged_to_the_prompt_tokens():
    pacer = StepPacer(0.3)
    pacer.observe(15, 15, 0.06)  # 15 streams decode alone: 60 ms a step
    assert pacer.decode_step_s == 0.06
    pacer.observe(15 + 120, 15, 0.24)  # a step with a 120-token chunk: 1.5 ms per prompt token on top
    assert abs(pacer.seconds_per_token - 0.0015) < 1e-9
    assert pacer.prompt_budget(512, decoding=True) == 160  # (300 - 60) ms / 1.5 ms
    # One cost per token over the whole step would have said 1.78 ms and 168 tokens with the decodes: 153.
    pacer.observe(15 + 40, 15, 0.18)  # a prompt's small tail chunk, dear per token: it moves the cost gradually
    assert 0.0015 < pacer.seconds_per_token < 0.0015 + 0.3 * (0.003 - 0.0015) + 1e-9
    assert pacer.prompt_budget(512, decoding=True) > 120


def test_small_steps_are_not_taken_as_measurements():
    pacer = StepPacer(0.4)
    pacer.observe(8 + 20, 8, 1.0)  # 20 prompt tokens next to 8 decodes: fixed costs dominate
    assert pacer.seconds_per_token is None
    pacer.observe(8, 8, 0.05)  # a step of decodes alone is what the base is made of
    assert pacer.decode_step_s == 0.05


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
