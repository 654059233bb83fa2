"""The step plan a shard decodes from rank 0's delta messages is the very plan rank 0's scheduler built."""

from __future__ import annotations

from dataclasses import replace

from tgi_llm.engine.runner_protocol import SampledToken, SeqResult
from tgi_llm.engine.scheduler import Scheduler
from tgi_llm.engine.step_plan import ScheduledSeq, StepPlan
from tgi_llm.lora.registry import LoraLoad
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
        assert send(encoder, decoder, plan) == 3 + 3 * len(plan.seqs)
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


# ---- speculative decoding: decodes with drafts, and starts that move back over rejected drafts ----

def verify_entry(request_id: int, start: int, tokens: list[int], blocks: list[int], num_drafts: int) -> ScheduledSeq:
    return ScheduledSeq(request_id, start, tokens, blocks, samples=True, is_decode=True, num_drafts=num_drafts)


def test_decodes_with_drafts_and_moved_starts_round_trip():
    """A prompt, a verify of 3 drafts (the mirror then expects the next start after them), one accepted so
    the next start is two before that (MOVED), a verify that takes a new block, a plain decode, and a
    shorter verify: the shard gets each plan exactly, is_decode and num_drafts included."""
    encoder, decoder = PlanEncoder(), PlanDecoder()
    prompt = ScheduledSeq(9, 0, list(range(100, 110)), [4, 7, 2], samples=True)
    plans = [
        StepPlan([prompt]),
        StepPlan([verify_entry(9, 10, [50, 51, 52, 53], [4, 7, 2], 3)]),   # mirror: next start 14
        StepPlan([verify_entry(9, 12, [52, 60, 61], [4, 7, 2], 2)]),       # 1 accepted: start 12, moved back
        StepPlan([verify_entry(9, 15, [62, 63, 64, 65, 66], [4, 7, 2, 5], 4)]),  # start 15 (all accepted), new block
        StepPlan([ScheduledSeq(9, 16, [70], [4, 7, 2, 5], samples=True, is_decode=True)]),  # moved, no drafts
        StepPlan([verify_entry(9, 17, [71, 72], [4, 7, 2, 5], 1)], released=[]),
    ]
    # Known-request records stay deltas: [id, meta, (start,) (num_drafts,) tokens..., new blocks...].
    lengths = [None, 3 + 2 + 1 + 4, 3 + 2 + 1 + 1 + 3, 3 + 2 + 1 + 5 + 1, 3 + 2 + 1 + 1, 3 + 2 + 1 + 2]
    for plan, length in zip(plans, lengths, strict=True):
        n = send(encoder, decoder, plan)
        assert length is None or n == length
        got = decoder.mirrors[9]
        assert got.num_tokens == plan.seqs[0].end and got.blocks == plan.seqs[0].block_ids
    assert decoder.mirrors == encoder.mirrors


def test_a_new_request_whose_first_record_is_a_verify_round_trips():
    """A record sent whole (FULL, e.g. a block table that changed) carries its drafts too; a decode
    without drafts keeps is_decode; a chunk keeps is_decode False."""
    encoder, decoder = PlanEncoder(), PlanDecoder()
    plan = StepPlan([
        ScheduledSeq(3, 20, [8], list(range(40)), samples=True, is_decode=True),
        verify_entry(4, 33, [1, 2, 3, 4, 5], [9, 8, 7], 4),
        ScheduledSeq(5, 0, [6, 6, 6], [1], samples=False, prompt_logprobs=True),
    ])
    send(encoder, decoder, plan)
    decoded = decoder.mirrors
    assert decoded[4].num_tokens == 38 and decoded[3].num_tokens == 21
    # More new blocks at once than a delta carries go whole again, with their drafts.
    grown = StepPlan([verify_entry(4, 35, [3, 9, 9], [9, 8, 7, *range(100, 140)], 2)])
    send(encoder, decoder, grown)


def test_a_speculating_scheduler_s_plans_round_trip(plan_player):
    """The scheduler with speculate=4 and a runner that accepts some drafts and rejects others: every plan
    over many steps (admissions, chunks, verifies, moved starts, releases) decodes to itself, and the run
    went through verifies, rejections and releases."""
    player = plan_player(block_size=4, num_blocks=256, step_tokens=24)
    player.scheduler = Scheduler(replace(player.scheduler.limits, speculate=4), player.kv)
    encoder, decoder = PlanEncoder(), PlanDecoder()

    def next_token(request_id: int, k: int) -> int:
        """The k-th generated token: mostly periodic (prompt lookup guesses right), sometimes not."""
        return 500 + (k % 3) if (k * 7 + request_id) % 11 else 900 + k

    prompts = [[500, 501, 502] * 5, [500, 501, 502, 503] * 6 + [1, 2], list(range(30, 70))]
    for i, p in enumerate(prompts):
        player.add(p, max_new_tokens=25 + 5 * i)
    ends: dict[int, int] = {}
    seen_drafts = seen_moved = seen_release = False
    for step in range(200):
        if step == 3:
            player.add([500, 501, 502] * 4, max_new_tokens=12)
        plan = player.plan()
        if plan.is_empty:
            break
        for e in plan.seqs:
            seen_drafts |= e.num_drafts > 0
            seen_moved |= e.request_id in ends and e.start != ends[e.request_id]
            ends[e.request_id] = e.end
        seen_release |= bool(plan.released)
        send(encoder, decoder, plan)
        results = []
        for e in plan.seqs:
            if not e.samples:
                results.append(None)
                continue
            seq = player.scheduler.running[e.request_id]
            k = seq.num_generated
            tokens = [next_token(e.request_id, k)]
            for draft in e.drafts:
                if draft != tokens[-1]:
                    break
                tokens.append(next_token(e.request_id, k + len(tokens)))
            results.append(SeqResult([SampledToken(t) for t in tokens], num_drafts=e.num_drafts))
        for seq, _ in player.scheduler.update(plan, results):
            if seq.finish_reason is not None:
                player.scheduler.finish(seq)
    else:
        raise AssertionError("the requests never finished")
    assert seen_drafts and seen_moved and seen_release
    assert player.scheduler.num_accepted_tokens > 0
    assert player.scheduler.num_accepted_tokens < player.scheduler.num_draft_tokens
    assert player.kv.num_free == player.kv.num_blocks


def test_lora_slots_and_adapter_loads_round_trip():
    encoder, decoder = PlanEncoder(), PlanDecoder()
    loads = [LoraLoad(1, "/adapters/ünïcode sql"), LoraLoad(0, "/a")]
    first = StepPlan([ScheduledSeq(3, 0, [1, 2, 3], [4], samples=True, lora_slot=1),
                      ScheduledSeq(5, 0, [9], [6], samples=True)], lora_loads=loads)
    send(encoder, decoder, first)
    decode = StepPlan([ScheduledSeq(3, 3, [7], [4], samples=True, is_decode=True, lora_slot=1),
                       ScheduledSeq(5, 1, [8], [6], samples=True, is_decode=True)])
    assert send(encoder, decoder, decode) == 3 + 3 + 1 + 3  # one more int for the sequence with an adapter
