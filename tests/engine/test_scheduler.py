"""The scheduler driven directly (no model): TGI v3 next_batch semantics for whole prompts, the chunked
prefill budget, prefix-cache admission, and `update` advancing sequences from fake runner results."""

from __future__ import annotations

import pytest

from tgi_llm.engine.kv_cache_manager import KVCacheManager
from tgi_llm.engine.limits import LimitOptions, resolve_limits
from tgi_llm.engine.runner_protocol import SampledToken, SeqResult
from tgi_llm.engine.scheduler import Scheduler
from tgi_llm.engine.sequence import Sequence
from tgi_llm.engine.step_plan import StepPlan
from tgi_llm.engine.stopping import StopChecker
from tgi_llm.request import SamplingParams, StoppingParams, ValidRequest

_ids = iter(range(1, 10**6))


class _SilentDetokenizer:
    def step(self, token_id: int) -> str:
        return ""

    def finish(self) -> str:
        return ""


def make_seq(input_len: int, max_new: int, prompt: list[int] | None = None, **request_kw) -> Sequence:
    """A prompt of `input_len` tokens shared with no other sequence (unless `prompt` is given)."""
    request_id = next(_ids)
    ids = tuple(prompt) if prompt is not None else tuple(range(request_id * 10_000, request_id * 10_000 + input_len))
    stopping = StoppingParams(max_new_tokens=max_new)
    req = ValidRequest(ids, SamplingParams(), stopping, **request_kw)
    return Sequence(request_id, req, lambda e: None, _SilentDetokenizer(), StopChecker({-1}, stopping))


def make_scheduler(num_blocks: int | None = None, **kw) -> Scheduler:
    base = dict(max_input_tokens=100, max_total_tokens=200, max_batch_prefill_tokens=256,
                max_batch_total_tokens=1024, block_size=16, prefill_chunking=False)
    base.update(kw)
    lim = resolve_limits(LimitOptions(**base), max_position_embeddings=None, kv_cache_tokens=None)
    return Scheduler(lim, KVCacheManager(num_blocks or lim.num_blocks, lim.block_size, lim.prefix_caching))


def run(s: Scheduler, plan: StepPlan, token: int = 7) -> list[Sequence]:
    """Play the runner: every sampling entry gets `token`."""
    results = [SeqResult([SampledToken(token, -0.5)]) if e.samples else None for e in plan.seqs]
    return [seq for seq, _ in s.update(plan, results)]


def prefills(plan: StepPlan) -> list[int]:
    return [e.request_id for e in plan.seqs if not e.is_decode]


def decodes(plan: StepPlan) -> list[int]:
    return [e.request_id for e in plan.seqs if e.is_decode]


def free_all(s: Scheduler) -> None:
    for seq in list(s.running.values()) + list(s.waiting):
        s.finish(seq)
    assert s.kv.num_free == s.kv.num_blocks
    s.kv.check()


# ---- whole prompts (PREFILL_CHUNKING=0): TGI v3's next_batch ----

def test_fifo_admission_within_prefill_budget():
    s = make_scheduler()
    seqs = [make_seq(100, 10) for _ in range(3)]
    for q in seqs:
        s.add(q)
    plan = s.schedule()
    # 256 prefill tokens (a block multiple already): two prompts of 100 fit, the third waits.
    assert prefills(plan) == [q.request_id for q in seqs[:2]] and decodes(plan) == []
    assert all(e.samples and e.start == 0 and e.num_tokens == 100 for e in plan.seqs)
    assert list(s.waiting) == [seqs[2]]
    free_all(s)


def test_prefill_budget_is_rounded_up_to_block_size():
    s = make_scheduler(max_batch_prefill_tokens=201)  # rounds to 208
    for _ in range(3):
        s.add(make_seq(104, 1))
    assert len(prefills(s.schedule())) == 2
    free_all(s)


def test_total_token_budget_counts_max_new_tokens():
    s = make_scheduler(num_blocks=1000, max_batch_total_tokens=400, max_batch_prefill_tokens=256)
    a, b = make_seq(50, 151), make_seq(50, 151)
    s.add(a)
    s.add(b)
    assert prefills(s.schedule()) == [a.request_id]  # 201 + 201 > 400
    free_all(s)


def test_entry_that_does_not_fit_goes_back_to_the_front():
    s = make_scheduler(max_batch_total_tokens=512, max_total_tokens=400, max_input_tokens=100,
                       waiting_served_ratio=0.0)
    first = make_seq(100, 100)
    s.add(first)
    run(s, s.schedule())
    big, small = make_seq(100, 250), make_seq(10, 10)
    s.add(big)
    s.add(small)
    plan = s.schedule()  # budget 512 - 200 = 312 < 350: big waits, and FIFO keeps small behind it
    assert prefills(plan) == [] and decodes(plan) == [first.request_id]
    assert list(s.waiting) == [big, small]
    s.finish(first)
    assert prefills(s.schedule()) == [big.request_id, small.request_id]
    free_all(s)


def test_blocks_are_allocated_for_prompt_plus_max_new_minus_one():
    s = make_scheduler()
    seq = make_seq(16, 17)
    s.add(seq)
    plan = s.schedule()
    assert len(plan.seqs[0].block_ids) == 2  # 32 tokens need 2 blocks of 16
    free_all(s)


def test_not_enough_blocks_keeps_queue_order():
    s = make_scheduler(num_blocks=4, max_batch_total_tokens=2048)  # the cache holds fewer than the budget
    a, b = make_seq(40, 20), make_seq(10, 10)
    s.add(a)
    s.add(b)
    assert prefills(s.schedule()) == [a.request_id]
    assert list(s.waiting) == [b]
    free_all(s)


def test_min_size_from_waiting_served_ratio_and_max_waiting_tokens():
    s = make_scheduler(waiting_served_ratio=1.0, max_waiting_tokens=3)
    for _ in range(2):
        s.add(make_seq(10, 50))
    run(s, s.schedule())
    late = make_seq(10, 10)
    s.add(late)
    # 2 running * ratio 1.0 = min_size 2, only 1 waiting: not admitted until 3 steps passed.
    run(s, plan := s.schedule())
    assert prefills(plan) == []
    run(s, plan := s.schedule())
    assert prefills(plan) == []
    plan = s.schedule()
    assert prefills(plan) == [late.request_id] and len(decodes(plan)) == 2
    free_all(s)


def test_min_size_rejection_returns_blocks_and_order():
    s = make_scheduler(waiting_served_ratio=2.0, max_waiting_tokens=100, max_batch_size=2)
    s.add(make_seq(10, 10))
    run(s, s.schedule())
    free_before = s.kv.num_free
    w = [make_seq(10, 10), make_seq(10, 10)]
    s.add(w[0])
    s.add(w[1])
    # min_size = floor(1 * 2.0) = 2 but max_size = 2 - 1 = 1: the one taken is handed back.
    assert prefills(s.schedule()) == [] and list(s.waiting) == w
    assert s.kv.num_free == free_before
    s.kv.check()
    free_all(s)


def test_max_batch_size_caps_admission():
    s = make_scheduler(max_batch_size=3, waiting_served_ratio=0.0)
    for _ in range(5):
        s.add(make_seq(5, 5))
    run(s, plan := s.schedule())
    assert len(prefills(plan)) == 3
    run(s, plan := s.schedule())
    assert prefills(plan) == []  # batch full
    s.finish(next(iter(s.running.values())))
    assert len(prefills(s.schedule())) == 1
    free_all(s)


def test_finished_sequences_leave_and_new_ones_join_continuously():
    s = make_scheduler(waiting_served_ratio=0.0)
    a, b = make_seq(5, 5), make_seq(5, 5)
    s.add(a)
    run(s, plan := s.schedule())
    assert prefills(plan) == [a.request_id]
    s.add(b)
    run(s, plan := s.schedule())
    assert prefills(plan) == [b.request_id] and decodes(plan) == [a.request_id]
    s.finish(a)
    plan = s.schedule()
    assert decodes(plan) == [b.request_id] and prefills(plan) == []
    assert plan.released == [a.request_id]  # the runner drops a's state with this plan
    assert s.schedule().released == []
    free_all(s)


def test_finish_of_waiting_sequence_removes_it():
    s = make_scheduler()
    a = make_seq(5, 5)
    s.add(a)
    s.finish(a)
    assert not s.has_work()
    assert s.schedule().released == []  # never ran: nothing for the runner to drop


# ---- update: the one place sequences advance ----

def test_update_advances_computed_tokens_and_appends_sampled_ones():
    s = make_scheduler(waiting_served_ratio=0.0)
    seq = make_seq(20, 3)
    s.add(seq)
    plan = s.schedule()
    assert run(s, plan, token=9) == [seq]
    assert seq.num_computed == 20 and seq.token_ids[-1] == 9 and seq.num_generated == 1
    (entry,) = s.schedule().seqs
    assert (entry.start, entry.token_ids, entry.samples, entry.is_decode) == (20, [9], True, True)
    free_all(s)


def test_update_ends_a_sequence_at_max_new_tokens():
    s = make_scheduler(waiting_served_ratio=0.0)
    seq = make_seq(4, 2)
    s.add(seq)
    run(s, s.schedule())
    assert seq.finish_reason is None
    run(s, s.schedule())
    assert seq.finish_reason is not None and seq.finish_reason.value == "length"
    free_all(s)


# ---- chunked prefill ----

def chunked(**kw) -> Scheduler:
    return make_scheduler(**{"prefill_chunking": True, "max_batch_prefill_tokens": 64, **kw})


def test_a_long_prompt_is_cut_into_budget_sized_chunks_that_sample_only_at_the_end():
    s = chunked()
    seq = make_seq(150, 4)
    s.add(seq)
    starts = []
    while seq.num_generated == 0:
        plan = s.schedule()
        (entry,) = plan.seqs
        starts.append((entry.start, entry.num_tokens, entry.samples))
        run(s, plan)
    assert starts == [(0, 64, False), (64, 64, False), (128, 22, True)]
    free_all(s)


def test_decodes_come_first_then_running_prefills_then_waiting_in_fifo_order():
    s = chunked()
    a = make_seq(10, 20)
    s.add(a)
    run(s, s.schedule())  # a decodes from now on
    b, c, d = make_seq(100, 4), make_seq(30, 4), make_seq(30, 4)
    s.add(b)
    plan = s.schedule()
    assert [(e.request_id, e.num_tokens) for e in plan.seqs] == [(a.request_id, 1), (b.request_id, 63)]
    run(s, plan)
    s.add(c)
    s.add(d)
    plan = s.schedule()  # 1 decode, b's last 37 tokens, 26 of c; d waits for the next step
    assert [(e.request_id, e.num_tokens) for e in plan.seqs] == [
        (a.request_id, 1), (b.request_id, 37), (c.request_id, 26)]
    assert list(s.waiting) == [d]
    run(s, plan)
    plan = s.schedule()  # a and b decode, c finishes its prompt, d joins
    assert [(e.request_id, e.num_tokens) for e in plan.seqs] == [
        (a.request_id, 1), (b.request_id, 1), (c.request_id, 4), (d.request_id, 30)]
    free_all(s)


def test_prompts_longer_than_the_step_budget_are_accepted_with_chunking():
    lim = resolve_limits(LimitOptions(max_input_tokens=1000, max_total_tokens=1100, max_batch_prefill_tokens=64,
                                      max_batch_total_tokens=4096), None, None)
    assert lim.max_batch_prefill_tokens == 64 and lim.max_input_tokens == 1000
    with pytest.raises(ValueError, match="max_batch_prefill_tokens"):
        resolve_limits(LimitOptions(max_input_tokens=1000, max_total_tokens=1100, max_batch_prefill_tokens=64,
                                    max_batch_total_tokens=4096, prefill_chunking=False), None, None)


def test_cancelling_mid_prefill_frees_the_blocks_at_once():
    s = chunked()
    seq = make_seq(150, 4)
    s.add(seq)
    run(s, s.schedule())
    assert s.kv.num_used > 0
    s.finish(seq)
    assert s.kv.num_used == 0 and s.schedule().released == [seq.request_id]
    s.kv.check()


def test_max_batch_size_caps_running_sequences_with_chunking():
    s = chunked(max_batch_size=2)
    for _ in range(3):
        s.add(make_seq(5, 5))
    assert len(s.schedule().seqs) == 2 and len(s.waiting) == 1
    free_all(s)


# ---- prefix caching ----

def test_a_repeated_prompt_reuses_its_full_blocks_and_computes_the_rest():
    s = chunked(max_batch_prefill_tokens=256)
    prompt = list(range(1000, 1040))  # 2 full blocks of 16 + 8 tokens
    first = make_seq(0, 2, prompt=prompt)
    s.add(first)
    run(s, s.schedule())
    s.finish(first)
    again = make_seq(0, 2, prompt=prompt)
    s.add(again)
    (entry,) = s.schedule().seqs
    assert again.num_cached == 32 and entry.start == 32 and entry.token_ids == prompt[32:]
    assert entry.block_ids[:2] == s.kv.block_ids(again)[:2]
    assert (s.kv.counters.queried_tokens, s.kv.counters.hit_tokens) == (80, 32)
    free_all(s)


def test_a_fully_cached_prompt_still_computes_its_last_block():
    s = chunked()
    prompt = list(range(500, 532))  # exactly 2 blocks
    a = make_seq(0, 1, prompt=prompt)
    s.add(a)
    run(s, s.schedule())
    s.finish(a)
    b = make_seq(0, 1, prompt=prompt)
    s.add(b)
    (entry,) = s.schedule().seqs
    assert b.num_cached == 16 and entry.start == 16 and entry.samples  # logits of the last token are needed
    free_all(s)


def test_generated_tokens_are_cached_for_the_next_turn():
    s = chunked()
    prompt = list(range(100, 120))  # 20 tokens; 12 generated fill the second block
    a = make_seq(0, 13, prompt=prompt)
    s.add(a)
    while a.finish_reason is None:
        run(s, s.schedule(), token=3)
    history = a.token_ids[:32]
    s.finish(a)
    b = make_seq(0, 1, prompt=history + [42, 43])
    s.add(b)
    s.schedule()
    assert b.num_cached == 32
    free_all(s)


def test_prompt_logprob_requests_bypass_the_lookup():
    s = chunked()
    prompt = list(range(200, 240))
    a = make_seq(0, 1, prompt=prompt)
    s.add(a)
    run(s, s.schedule())
    s.finish(a)
    b = make_seq(0, 1, prompt=prompt, decoder_input_details=True)
    s.add(b)
    (entry,) = s.schedule().seqs
    assert b.num_cached == 0 and entry.start == 0 and entry.prompt_logprobs
    free_all(s)


def test_different_cache_keys_never_share_blocks():
    s = chunked()
    prompt = list(range(300, 340))
    a = make_seq(0, 1, prompt=prompt, cache_key=b"adapter-a")
    s.add(a)
    run(s, s.schedule())
    s.finish(a)
    b = make_seq(0, 1, prompt=prompt, cache_key=b"adapter-b")
    s.add(b)
    s.schedule()
    assert b.num_cached == 0
    free_all(s)


def test_prefix_caching_off_never_reuses():
    s = chunked(prefix_caching=False)
    prompt = list(range(400, 440))
    for _ in range(2):
        seq = make_seq(0, 1, prompt=prompt)
        s.add(seq)
        run(s, s.schedule())
        assert seq.num_cached == 0
        s.finish(seq)
    assert s.kv.num_cached_free == 0
    free_all(s)


def test_paced_steps_take_fewer_prompt_tokens_while_streams_decode_but_always_a_block():
    s = chunked(max_batch_prefill_tokens=256, prefill_step_target_ms=100)
    s.pacer.seconds_per_token = 0.002  # measured: 50 tokens fit 100 ms
    a = make_seq(10, 50)
    s.add(a)
    run(s, s.schedule())  # a decodes from now on
    long = make_seq(200, 4)
    s.add(long)
    (decode, chunk) = s.schedule().seqs
    assert decode.num_tokens == 1 and chunk.num_tokens == 50
    s.pacer.decode_step_s = 0.04  # decoding alone takes 40 ms of the 100: 30 prompt tokens fit the rest
    assert s.schedule().seqs[-1].num_tokens == 30
    s.pacer.seconds_per_token = 1.0  # a very slow machine: prompts still move a block per step
    run(s, s.schedule())
    plan = s.schedule()
    assert plan.seqs[-1].num_tokens == 16
    free_all(s)


def test_paced_chunks_deep_in_a_prompt_take_fewer_tokens_for_the_same_time():
    s = chunked(max_batch_prefill_tokens=512, prefill_step_target_ms=100, max_input_tokens=1300,
                max_total_tokens=1400, max_batch_total_tokens=4096)
    s.pacer.context_weight = 1e-3  # a token at context 1,000 costs two at context 0
    s.pacer.seconds_per_token = 0.001  # 100 tokens at context 0 fit 100 ms
    a = make_seq(10, 50)
    s.add(a)
    run(s, s.schedule())  # a decodes from now on
    long = make_seq(1200, 4)
    s.add(long)
    sizes = []
    for _ in range(100):  # hang guard
        if long.num_computed >= long.input_length:
            break
        plan = s.schedule()
        sizes.append(plan.seqs[-1].num_tokens)
        run(s, plan)
    assert sum(sizes) == 1200
    assert sizes[0] == 95 and sizes[-2] < 60  # 100 units at context 0 (95 tokens and their own context), ~50 deep
    assert all(later <= earlier for earlier, later in zip(sizes[:-2], sizes[1:-1], strict=True))  # ever fewer
    free_all(s)


@pytest.mark.parametrize("policy", ["shortest-prompt", "fcfs"])
def test_a_short_prompt_starts_before_an_earlier_long_one_once_prefill_is_measured(policy):
    s = chunked(max_batch_prefill_tokens=256, prefill_step_target_ms=100, scheduling_policy=policy)
    a = make_seq(10, 50)
    s.add(a)
    run(s, s.schedule())  # a decodes from now on
    long, short = make_seq(90, 4), make_seq(20, 4)
    s.add(long)
    s.add(short)
    plan = s.schedule()  # nothing measured yet: arrival order
    assert prefills(plan) == [long.request_id, short.request_id]
    s.finish(long)
    s.finish(short)
    long, short = make_seq(90, 4), make_seq(20, 4)
    s.add(long)
    s.add(short)
    s.pacer.seconds_per_token = 0.001  # measured: 90 tokens fit the 100 ms
    plan = s.schedule()
    order = [short, long] if policy == "shortest-prompt" else [long, short]
    assert prefills(plan) == [seq.request_id for seq in order]
    free_all(s)


def test_twin_prompts_wait_for_the_first_prefill_then_find_it_cached():
    s = chunked(max_batch_prefill_tokens=64)
    prompt = list(range(700, 800))  # 100 tokens: two 64-token steps
    a, b, c = (make_seq(0, 3, prompt=prompt) for _ in range(3))
    other = make_seq(20, 3)
    for seq in (a, b, c, other):
        s.add(seq)
    plan = s.schedule()
    assert [e.request_id for e in plan.seqs] == [a.request_id]  # the twins wait; other has no budget left
    run(s, plan)
    plan = s.schedule()
    assert [e.request_id for e in plan.seqs] == [a.request_id, other.request_id]  # other is not held back
    assert list(s.waiting) == [b, c]
    run(s, plan)
    plan = s.schedule()  # a's prompt is computed: the twins come in with 96 of 100 tokens cached
    assert {e.request_id for e in plan.seqs if not e.is_decode} == {b.request_id, c.request_id}
    assert b.num_cached == c.num_cached == 96
    free_all(s)
