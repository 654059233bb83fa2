"""The step plan a shard decodes from rank 0's delta messages is the very plan rank 0's scheduler built."""

from __future__ import annotations

from tgi_llm.engine.step_plan import StepPlan
from tgi_llm.parallel.plan_codec import PlanDecoder, PlanEncoder

from ..conftest import PlanPlayer


def send(encoder: PlanEncoder, decoder: PlanDecoder, plan: StepPlan) -> int:
    """One step over the wire; the shard's plan must equal rank 0's. Returns the message's length."""
    message = encoder.encode(plan)
    encoder.commit()
    assert decoder.decode(message) == plan
    return message.numel()


def test_decode_steps_send_three_ints_per_sequence():
    player = PlanPlayer(block_size=4, num_blocks=64)
    encoder, decoder = PlanEncoder(), PlanDecoder()
    player.add(list(range(10)), max_new_tokens=8)
    player.add([7, 8, 9], max_new_tokens=8, decoder_input_details=True)
    plan = player.plan()
    assert send(encoder, decoder, plan) > 2 + 2 * 4 + 13  # new sequences go whole: tokens and block tables
    player.advance(plan)
    for _ in range(5):
        plan = player.plan()
        assert send(encoder, decoder, plan) == 2 + 3 * len(plan.seqs)
        player.advance(plan)


def test_chunks_prefix_hits_releases_and_new_sequences_round_trip():
    player = PlanPlayer(block_size=4, num_blocks=64, step_tokens=12)
    encoder, decoder = PlanEncoder(), PlanDecoder()
    system = list(range(40, 60))
    player.add(system + [1, 2, 3], max_new_tokens=3)  # chunked over two steps
    player.add([5, 6, 7, 8, 9], max_new_tokens=2, decoder_input_details=True)
    seen_hit = seen_release = False
    for step in range(12):
        if step == 4:
            player.add(system + [4], max_new_tokens=2)  # reuses the first one's computed blocks
        plan = player.plan()
        if plan.is_empty:
            break
        seen_hit |= any(e.start > 0 and not e.is_decode and e.start % 4 == 0 and e.start >= 16 for e in plan.seqs)
        seen_release |= bool(plan.released)
        send(encoder, decoder, plan)
        player.advance(plan)
    assert seen_hit and seen_release
    assert decoder.mirrors == encoder.mirrors


def test_nothing_changes_until_commit():
    player = PlanPlayer(block_size=4, num_blocks=16)
    encoder, decoder = PlanEncoder(), PlanDecoder()
    player.add([1, 2, 3])
    plan = player.plan()
    encoder.encode(plan)  # e.g. the send failed: no commit
    message = encoder.encode(plan)
    encoder.commit()
    assert decoder.decode(message) == plan
