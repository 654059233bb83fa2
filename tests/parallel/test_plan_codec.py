"""The step plan a shard rebuilds from rank 0's delta messages equals the one rank 0 plans itself."""

from __future__ import annotations

from tgi_llm.engine.block_allocator import BlockAllocator
from tgi_llm.parallel.plan_codec import PlanDecoder, PlanEncoder
from tgi_llm.runner.batch_inputs import plan_step

from .conftest import make_seq


def step(encoder: PlanEncoder, decoder: PlanDecoder, batch) -> int:
    """Send one step; assert the shard's plan equals rank 0's; advance the sequences like the engine does."""
    message = encoder.encode(batch)
    encoder.commit()
    assert decoder.decode(message) == plan_step(batch)
    for i, seq in enumerate(batch):
        seq.num_computed = len(seq.token_ids)
        seq.token_ids.append(1000 + i)  # the sampled token
    return message.numel()


def test_decode_steps_send_three_ints_per_sequence_and_plans_match():
    allocator = BlockAllocator(64, 4)
    encoder, decoder = PlanEncoder(), PlanDecoder(block_size=4)
    batch = [make_seq(1, list(range(10)), allocator, max_new_tokens=8),
             make_seq(2, [7, 8, 9], allocator, max_new_tokens=8, decoder_input_details=True)]
    prefill = step(encoder, decoder, batch)
    assert prefill > 2 + 2 * 4 + 13  # new sequences go whole: tokens and block tables
    for _ in range(5):
        assert step(encoder, decoder, batch) == 2 + 3 * len(batch)


def test_release_new_blocks_preemption_and_a_new_sequence():
    allocator = BlockAllocator(64, 4)
    encoder, decoder = PlanEncoder(), PlanDecoder(block_size=4)
    a, b = make_seq(1, [1, 2, 3], allocator), make_seq(2, [4, 5, 6, 7, 8], allocator)
    step(encoder, decoder, [a, b])
    step(encoder, decoder, [a, b])
    # b finishes: released on both sides with the next message
    encoder.release(2)
    c = make_seq(3, [9] * 9, allocator, decoder_input_details=True)
    step(encoder, decoder, [a, c])
    assert 2 not in decoder.mirrors
    # a grows one block beyond what it had (a delta of blocks), then is preempted and restarts whole
    a.allocation.blocks.append(allocator.allocate(1).blocks[0])
    step(encoder, decoder, [a, c])
    a.num_computed = 0
    a.allocation.blocks.reverse()
    step(encoder, decoder, [c, a])
    assert decoder.mirrors == encoder.mirrors


def test_nothing_changes_until_commit():
    allocator = BlockAllocator(16, 4)
    encoder, decoder = PlanEncoder(), PlanDecoder(block_size=4)
    seq = make_seq(1, [1, 2, 3], allocator)
    encoder.encode([seq])  # e.g. the send failed: no commit
    message = encoder.encode([seq])
    encoder.commit()
    assert decoder.decode(message) == plan_step([seq])
