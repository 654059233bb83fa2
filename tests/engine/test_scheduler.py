"""TGI v3 next_batch semantics, driven directly (no model)."""

from tgi_llm.engine.block_allocator import BlockAllocator
from tgi_llm.engine.limits import LimitOptions, resolve_limits
from tgi_llm.engine.scheduler import Scheduler
from tgi_llm.engine.sequence import Sequence
from tgi_llm.request import SamplingParams, StoppingParams, ValidRequest

_ids = iter(range(1, 10**6))


def make_seq(input_len: int, max_new: int) -> Sequence:
    req = ValidRequest(tuple(range(input_len)), SamplingParams(), StoppingParams(max_new_tokens=max_new))
    return Sequence(next(_ids), req, lambda e: None)


def make_scheduler(**kw) -> Scheduler:
    base = dict(max_input_tokens=100, max_total_tokens=200, max_batch_prefill_tokens=256,
                max_batch_total_tokens=1024, block_size=16)
    base.update(kw)
    lim = resolve_limits(LimitOptions(**base), max_position_embeddings=None, kv_cache_tokens=None)
    return Scheduler(lim, BlockAllocator(lim.num_blocks, lim.block_size))


def free_all(s: Scheduler) -> None:
    for seq in list(s.running) + list(s.waiting):
        s.finish(seq)
    assert s.allocator.num_free == s.allocator.num_blocks


def test_fifo_admission_within_prefill_budget():
    s = make_scheduler()
    seqs = [make_seq(100, 10) for _ in range(3)]
    for q in seqs:
        s.add(q)
    out = s.schedule()
    # 256 prefill tokens (a block multiple already): two prompts of 100 fit, the third waits.
    assert out.prefill == seqs[:2] and out.decode == []
    assert list(s.waiting) == [seqs[2]]
    free_all(s)


def test_prefill_budget_is_rounded_up_to_block_size():
    s = make_scheduler(max_batch_prefill_tokens=201)  # rounds to 208
    for _ in range(3):
        s.add(make_seq(104, 1))
    assert len(s.schedule().prefill) == 2
    free_all(s)


def test_total_token_budget_counts_max_new_tokens():
    s = make_scheduler(max_batch_total_tokens=400, max_batch_prefill_tokens=256)
    s.allocator = BlockAllocator(num_blocks=1000, block_size=16)  # only the token budget binds
    a, b = make_seq(50, 151), make_seq(50, 151)
    s.add(a)
    s.add(b)
    assert s.schedule().prefill == [a]  # 201 + 201 > 400
    free_all(s)


def test_entry_that_does_not_fit_goes_back_to_the_front():
    s = make_scheduler(max_batch_total_tokens=512, max_total_tokens=400, max_input_tokens=100,
                       waiting_served_ratio=0.0)
    s.add(make_seq(100, 100))
    s.schedule()
    big, small = make_seq(100, 250), make_seq(10, 10)
    s.add(big)
    s.add(small)
    out = s.schedule()  # budget 512 - 200 = 312 < 350: big waits, and FIFO keeps small behind it
    assert out.prefill == []
    assert list(s.waiting) == [big, small]
    s.finish(s.running[0])
    assert s.schedule().prefill == [big, small]
    free_all(s)


def test_blocks_are_allocated_for_prompt_plus_max_new_minus_one():
    s = make_scheduler()
    seq = make_seq(16, 17)
    s.add(seq)
    s.schedule()
    assert len(seq.allocation.blocks) == 2  # 32 tokens need 2 blocks of 16
    free_all(s)


def test_not_enough_blocks_keeps_queue_order():
    s = make_scheduler(max_batch_total_tokens=2048)
    s.allocator = BlockAllocator(num_blocks=4, block_size=16)  # the cache holds fewer tokens than the budget
    a, b = make_seq(40, 20), make_seq(10, 10)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert out.prefill == [a]
    assert list(s.waiting) == [b]
    free_all(s)


def test_min_size_from_waiting_served_ratio_and_max_waiting_tokens():
    s = make_scheduler(waiting_served_ratio=1.0, max_waiting_tokens=3)
    running = [make_seq(10, 50) for _ in range(2)]
    for q in running:
        s.add(q)
    s.schedule()
    late = make_seq(10, 10)
    s.add(late)
    # 2 running * ratio 1.0 = min_size 2, only 1 waiting: not admitted until 3 steps passed.
    assert s.schedule().prefill == []
    assert s.schedule().prefill == []
    out = s.schedule()
    assert out.prefill == [late] and len(out.decode) == 2
    free_all(s)


def test_min_size_rejection_returns_blocks_and_order():
    s = make_scheduler(waiting_served_ratio=2.0, max_waiting_tokens=100, max_batch_size=2)
    s.add(make_seq(10, 10))
    s.schedule()
    free_before = s.allocator.num_free
    w = [make_seq(10, 10), make_seq(10, 10)]
    s.add(w[0])
    s.add(w[1])
    # min_size = floor(1 * 2.0) = 2 but max_size = 2 - 1 = 1: the one taken is handed back.
    out = s.schedule()
    assert out.prefill == [] and list(s.waiting) == w
    assert s.allocator.num_free == free_before
    free_all(s)


def test_max_batch_size_caps_admission():
    s = make_scheduler(max_batch_size=3, waiting_served_ratio=0.0)
    for _ in range(5):
        s.add(make_seq(5, 5))
    assert len(s.schedule().prefill) == 3
    assert s.schedule().prefill == []  # batch full
    s.finish(s.running[0])
    assert len(s.schedule().prefill) == 1
    free_all(s)


def test_finished_sequences_leave_and_new_ones_join_continuously():
    s = make_scheduler(waiting_served_ratio=0.0)
    a, b = make_seq(5, 5), make_seq(5, 5)
    s.add(a)
    assert s.schedule().prefill == [a]
    s.add(b)
    out = s.schedule()
    assert out.prefill == [b] and out.decode == [a]
    s.finish(a)
    out = s.schedule()
    assert out.decode == [b] and out.prefill == []
    free_all(s)


def test_finish_of_waiting_sequence_removes_it():
    s = make_scheduler()
    a = make_seq(5, 5)
    s.add(a)
    s.finish(a)
    assert not s.has_work()
