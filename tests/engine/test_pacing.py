"""The step pacer: a prompt budget that follows the measured cost per token while streams decode, counting
what a token's place in its prompt adds (attention over the context before it)."""

from __future__ import annotations

import pytest

from tgi_llm.engine.limits import LimitOptions, resolve_limits
from tgi_llm.engine.pacing import StepBudget, StepPacer, chunk_work, tokens_within


def budget(pacer: StepPacer, cap: int = 512, decoding: bool = True, context: int = 0) -> int:
    """Tokens the next step would give one prompt chunk starting at `context`."""
    return pacer.step_budget(cap, decoding, floor=min(pacer.min_tokens, cap)).take(context, cap)


def test_no_target_or_no_decodes_or_no_measurement_gives_the_whole_cap():
    assert budget(StepPacer(None)) == 512
    pacer = StepPacer(0.4)
    assert budget(pacer) == 512  # nothing measured yet
    pacer.observe(100, 0, 1.0)
    assert budget(pacer, 512, False) == 512  # nobody would wait for this step


def test_budget_follows_the_cost_per_prompt_token_within_the_cap_and_a_block():
    pacer = StepPacer(0.4, min_tokens=16)
    pacer.observe(200, 0, 1.0)  # 5 ms per token
    assert budget(pacer) == 80
    pacer.observe(200, 0, 0.2)  # the machine got faster: the median of 5 and 1 ms per token is their mean
    assert budget(pacer) == 133
    pacer.observe(100, 0, 1.0)  # one dear step (a host's hiccup) does not resize the next: median 5 ms
    assert budget(pacer) == 80
    pacer.observe(100, 0, 1.0)  # two of the last three: 10 ms per token it is
    assert budget(pacer) == 40
    slow = StepPacer(0.4, min_tokens=16)
    slow.observe(64, 0, 64.0)  # 1 s per token: still one block per step
    assert budget(slow) == 16
    assert budget(StepPacer(10.0, seconds_per_token=0.001)) == 512


def test_what_decoding_costs_is_not_charged_to_the_prompt_tokens():
    pacer = StepPacer(0.3)
    pacer.observe(15, 15, 0.06)  # 15 streams decode alone: 60 ms a step
    assert pacer.decode_step_s == 0.06
    pacer.observe(15 + 120, 15, 0.24)  # a step with a 120-token chunk: 1.5 ms per prompt token on top
    assert abs(pacer.seconds_per_token - 0.0015) < 1e-9
    assert budget(pacer) == 160  # (300 - 60) ms / 1.5 ms
    # One cost per token over the whole step would have said 1.78 ms and 168 tokens with the decodes: 153.
    pacer.observe(15 + 40, 15, 0.18)  # a prompt's small tail chunk, dear per token (3 ms): the median of two
    assert abs(pacer.seconds_per_token - 0.00225) < 1e-9
    pacer.observe(15 + 120, 15, 0.24)  # and once the usual cost comes back, it is ignored
    assert abs(pacer.seconds_per_token - 0.0015) < 1e-9
    assert budget(pacer) == 160


def test_costs_measured_before_decoding_alone_was_seen_give_way_to_the_first_that_knows_it():
    pacer = StepPacer(0.3)
    pacer.observe(3 + 200, 3, 0.26)  # streams decode, but what that costs is unknown: all charged to the prompt
    assert abs(pacer.seconds_per_token - 0.0013) < 1e-12 and not pacer.calibrated
    pacer.observe(8, 8, 0.035)  # decoding alone: 35 ms
    assert budget(pacer) == 203  # (300 - 35) ms / 1.3 ms
    pacer.observe(8 + 203, 8, 0.035 + 203 * 0.0008)  # 0.8 ms per token once the decodes are not counted
    assert abs(pacer.seconds_per_token - 0.0008) < 1e-12 and pacer.calibrated
    assert budget(pacer) == 331  # the next step fills the target, not ~40 ms short of it
    pacer.observe(8 + 331, 8, 0.035 + 331 * 0.0006)  # from now on the cost is the median of the last three
    assert abs(pacer.seconds_per_token - 0.0007) < 1e-12
    small = StepPacer(0.3)  # a small step (a prompt's tail) with the decodes known replaces nothing
    small.observe(3 + 200, 3, 0.26)
    small.observe(8, 8, 0.035)
    budget(small)
    small.observe(8 + 40, 8, 0.035 + 40 * 0.0008)
    # 0.84 ms (half the 67 ms step over 40 tokens: a small step's floor) beside the uncalibrated 1.3 ms, which stays
    assert abs(small.seconds_per_token - (0.0013 + 0.0335 / 40) / 2) < 1e-12 and not small.calibrated


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


K = 1e-3  # a context weight that makes the effect plain: a token at context 1,000 costs 2 at context 0


def test_work_counts_each_token_with_the_context_it_attends_to_and_inverts_exactly():
    assert chunk_work(0, 100, 0.0) == 100
    assert chunk_work(1000, 100, K) == 100 * (1 + K * 1050)
    for context in (0, 37, 1000, 5000):
        for n in (1, 16, 200, 999):
            work = chunk_work(context, n, K)
            assert tokens_within(work, context, K) == n
            assert tokens_within(work - 1e-6, context, K) == n - 1
    assert tokens_within(0.0, 0, K) == tokens_within(-5.0, 0, K) == 0


def test_a_sample_far_into_a_prompt_does_not_make_the_next_prompts_chunks_small():
    pacer = StepPacer(0.3, min_tokens=16, context_weight=K)
    pacer.observe(8, 8, 0.02)  # decoding alone: 20 ms
    pacer.observe(8 + 100, 8, 0.02 + 0.001 * chunk_work(1400, 100, K), chunks=[(1400, 100)])
    assert abs(pacer.seconds_per_token - 0.001) < 1e-12  # 1 ms per token at context 0, as it really is
    assert budget(pacer, context=0) == tokens_within(280, 0, K)  # the next prompt's first chunk: 248 tokens, not 114
    assert budget(pacer, context=1400) < 140  # and a chunk as deep as the sample: what fits 280 ms there
    without = StepPacer(0.3, min_tokens=16)  # the same steps counted in tokens only
    without.observe(8, 8, 0.02)
    without.observe(8 + 100, 8, 0.02 + 0.001 * chunk_work(1400, 100, K))
    assert budget(without, context=0) == 114  # sized for the deep chunk's 2.45 ms per token: 280 / 2.45


def test_one_steps_budget_is_shared_by_its_chunks_with_a_block_for_the_first_whatever_it_costs():
    shared = StepBudget(512, work=300.0, context_weight=K)
    first = shared.take(1000, 100)
    assert first == 100 and abs(shared.work - (300 - chunk_work(1000, 100, K))) < 1e-9
    assert shared.take(0, 512) == tokens_within(300 - chunk_work(1000, 100, K), 0, K)
    assert shared.exhausted and shared.take(0, 10) == 0
    tight = StepBudget(512, work=1.0, context_weight=K, floor=16)
    assert tight.take(4000, 100) == 16 and tight.take(0, 100) == 0  # the block goes to the first chunk only
    capped = StepBudget(40, work=None)
    assert capped.take(9000, 100) == 40 and capped.exhausted
