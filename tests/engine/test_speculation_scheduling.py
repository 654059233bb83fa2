"""Speculative decoding in the scheduler and the engine loop, with the scripted FakeRunner (which accepts
a draft exactly when it is the script's next token): decodes feed prompt-lookup drafts in the plan order
the runner relies on, within the blocks admission gave them; only accepted tokens count as computed; the
events are token for token those of `speculate=0`, however a stop ends an accepted run; the request-level
`speculate` turns it down or off, and is validated against the server's limit."""

from __future__ import annotations

import pytest

from tgi_llm.engine import Engine, LimitOptions
from tgi_llm.engine.kv_cache_manager import KVCacheManager
from tgi_llm.engine.limits import resolve_limits
from tgi_llm.engine.scheduler import Scheduler
from tgi_llm.engine.sequence import Sequence
from tgi_llm.engine.step_plan import StepPlan
from tgi_llm.engine.stopping import StopChecker
from tgi_llm.errors import ArgumentValidationError, ValidationError
from tgi_llm.events import FinalEvent, TokenEvent
from tgi_llm.request import SamplingParams, StoppingParams, ValidRequest

from ..speculation.always_pays import AlwaysPays
from .fake_runner import FakeRunner
from .test_engine_loop import Collector

TIMEOUT = 20.0
SPECULATE = 4


# ---- the scheduler driven directly ----

class _SilentDetokenizer:
    def step(self, token_id: int) -> str:
        return ""

    def finish(self) -> str:
        return ""


_ids = iter(range(1, 10**6))


def make_seq(prompt: list[int], max_new: int, **request_kw) -> Sequence:
    stopping = StoppingParams(max_new_tokens=max_new)
    request = ValidRequest(tuple(prompt), SamplingParams(), stopping, **request_kw)
    return Sequence(next(_ids), request, lambda e: None, _SilentDetokenizer(), StopChecker({-1}, stopping))


def make_scheduler(speculate: int = SPECULATE, **kw) -> Scheduler:
    base = dict(max_input_tokens=100, max_total_tokens=200, max_batch_prefill_tokens=256,
                max_batch_total_tokens=2048, block_size=16, speculate=speculate)
    base.update(kw)
    lim = resolve_limits(LimitOptions(**base), max_position_embeddings=None, kv_cache_tokens=None)
    return Scheduler(lim, KVCacheManager(lim.num_blocks, lim.block_size, lim.prefix_caching))


def step(s: Scheduler, runner: FakeRunner) -> StepPlan:
    """One step: plan, the fake runner's results, update; finished sequences leave."""
    plan = s.schedule()
    for seq, _ in s.update(plan, runner.execute(plan)):
        if seq.finish_reason is not None:
            s.finish(seq)
    return plan


def kind(entry) -> int:
    """0: a decode without drafts, 1: a decode with drafts, 2: a prompt chunk (the order plans keep)."""
    return 2 if not entry.is_decode else (1 if entry.num_drafts else 0)


CYCLE = [11, 12, 13, 14, 15]


def test_plan_order_is_plain_decodes_then_verifying_decodes_then_prompt_chunks():
    """A (admitted first) repeats its prompt and guesses; B never repeats and does not; C arrives while
    they decode: the plan puts B before A whatever the admission order, and C's prompt last."""
    runner = FakeRunner(CYCLE, per_prompt={500: list(range(600, 700))})
    s = make_scheduler()
    a = make_seq(CYCLE * 3, max_new=30)
    b = make_seq(list(range(500, 520)), max_new=30)
    s.add(a)
    s.add(b)
    step(s, runner)  # both prompts
    s.add(make_seq(list(range(800, 840)), max_new=5))
    plan = step(s, runner)
    assert [(e.request_id, kind(e)) for e in plan.seqs] == [(b.request_id, 0), (a.request_id, 1),
                                                            (plan.seqs[2].request_id, 2)]
    verify = plan.seqs[1]
    assert verify.is_decode and verify.samples and verify.num_drafts == SPECULATE
    assert verify.token_ids == [a.token_ids[verify.start], *verify.drafts]
    assert verify.drafts == CYCLE[1:] and len(verify.token_ids) == 1 + verify.num_drafts
    while s.has_work():
        step(s, runner)
    assert s.kv.num_free == s.kv.num_blocks
    s.kv.check()


def test_whole_prompt_policy_keeps_the_same_order():
    runner = FakeRunner(CYCLE, per_prompt={500: list(range(600, 700))})
    s = make_scheduler(prefill_chunking=False, waiting_served_ratio=0.0)
    a, b = make_seq(CYCLE * 3, max_new=30), make_seq(list(range(500, 520)), max_new=30)
    s.add(a)
    s.add(b)
    step(s, runner)
    s.add(make_seq(list(range(800, 840)), max_new=5))
    plan = step(s, runner)
    assert [kind(e) for e in plan.seqs] == [0, 1, 2]
    assert [e.request_id for e in plan.seqs[:2]] == [b.request_id, a.request_id]
    while s.has_work():
        step(s, runner)
    assert s.kv.num_free == s.kv.num_blocks


@pytest.mark.parametrize("max_new", [1, 2, 3, 4, 6, 9])
def test_drafts_never_reach_past_max_new_tokens(max_new):
    """A decode that has generated g tokens guesses at most max_new - g - 1: the blocks admission gave it
    hold no more, and the step's last token is the model's own. The output is exactly max_new tokens."""
    runner = FakeRunner(CYCLE)
    s = make_scheduler()
    seq = make_seq(CYCLE * 4, max_new=max_new)
    s.add(seq)
    seen = []
    while s.has_work():
        plan = step(s, runner)
        for e in plan.seqs:
            if e.is_decode:
                generated = e.start + 1 - seq.input_length
                assert e.num_drafts <= min(SPECULATE, max_new - generated - 1)
                seen.append(e.num_drafts)
    assert seq.num_generated == max_new and seq.token_ids[seq.input_length:] == (CYCLE * 4)[:max_new]
    if max_new >= 3:
        assert max(seen) == min(SPECULATE, max_new - 2)  # the room was used, not just respected
    assert s.kv.num_free == s.kv.num_blocks


def test_rejected_drafts_are_not_computed_and_the_next_step_starts_after_the_accepted_ones():
    """The prompt suggests 11 12 13 14 after 15 but the script continues 11 12 99: two drafts accepted, two
    rejected. The sequence counts start + 1 + accepted computed tokens, the next step feeds from there, and
    the counters and the draft length follow."""
    script = [11, 12, 99, 98, 97, 96, 95, 94]
    runner = FakeRunner(script, per_prompt={15: script})
    s = make_scheduler()
    seq = make_seq([15, 11, 12, 13, 14, 15, 11, 12, 13, 14, 15], max_new=8)  # the prompt's last token is 15
    s.add(seq)
    step(s, runner)  # prompt; samples 11
    plan = step(s, runner)
    verify = plan.seqs[0]
    assert verify.drafts == [12, 13, 14, 15]
    assert seq.token_ids[seq.input_length:] == [11, 12, 99]  # 12 accepted, 99 chosen instead of 13
    assert seq.num_computed == verify.start + 1 + 1 == len(seq.token_ids) - 1
    assert (seq.drafted_tokens, seq.accepted_tokens) == (4, 1)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (1, 4, 1)
    assert seq.draft_length is not None and seq.draft_length.current == 2  # accepted + 1
    nxt = s.schedule()
    assert nxt.seqs[0].start == seq.num_computed and nxt.seqs[0].token_ids[0] == 99
    s.finish(seq)
    assert s.kv.num_free == s.kv.num_blocks


def test_a_stream_whose_guesses_do_not_pay_stops_guessing():
    """When the measured steps say an extra row costs as much as a whole step, break-even nears 1 and a
    sequence at the prior acceptance guesses nothing."""
    runner = FakeRunner(CYCLE)
    s = make_scheduler()
    for rows in range(1, 30):
        s.speculation.observe(rows, 0.001 * rows)  # no fixed cost at all
    seq = make_seq(CYCLE * 3, max_new=10)
    s.add(seq)
    while s.has_work():
        plan = step(s, runner)
        assert all(e.num_drafts == 0 for e in plan.seqs)
    assert seq.token_ids[seq.input_length:] == (CYCLE * 3)[:10]


def test_speculate_zero_schedules_as_before():
    runner = FakeRunner(CYCLE)
    s = make_scheduler(speculate=0)
    seq = make_seq(CYCLE * 3, max_new=10)
    s.add(seq)
    while s.has_work():
        plan = step(s, runner)
        assert all(e.num_drafts == 0 and len(e.token_ids) == 1 for e in plan.seqs if e.is_decode)
    assert seq.draft_length is None and s.num_drafts == 0


# ---- the engine loop ----

LIMITS = dict(max_input_tokens=64, max_total_tokens=128, max_batch_prefill_tokens=256, max_batch_total_tokens=4096)


def make_engine(tokenizer, runner, speculate: int, **limit_kw) -> Engine:
    base = dict(LIMITS, waiting_served_ratio=0.0, speculate=speculate)
    base.update(limit_kw)
    limits = resolve_limits(LimitOptions(**base), max_position_embeddings=None, kv_cache_tokens=None)
    engine = Engine(tokenizer, limits, runner, eos_token_ids={tokenizer.eos_token_id})
    engine.scheduler.speculation = AlwaysPays(speculate)
    engine.start()
    return engine


@pytest.fixture
def words(tokenizer):
    ids = tokenizer(" the quick brown fox jumps", add_special_tokens=False)["input_ids"]
    assert len(set(ids)) == len(ids) >= 4
    return ids


def workload(tokenizer, words):
    """(name, prompt, params) of requests whose scripted outputs repeat their prompts, so prompt lookup
    guesses right, plus one that never repeats."""
    eos = tokenizer.eos_token_id
    marker, plain = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in ("A", "Z"))
    a, b, c = words[:3]
    return [
        ("length", words * 3, {"max_new_tokens": 23}),
        ("stop", words * 3, {"max_new_tokens": 30, "stop": [" brown"]}),  # 3rd token, inside the 1st run
        ("stop late", words * 3, {"max_new_tokens": 30, "stop": [" fox jumps the quick"]}),
        ("eos", [marker, a, b, eos, c], {"max_new_tokens": 30}),  # eos is a draft, accepted mid-run
        ("short", words * 3, {"max_new_tokens": 3}),
        ("one", words * 3, {"max_new_tokens": 1}),
        ("never repeats", [plain, 7, 8, 9], {"max_new_tokens": 12}),
        ("request off", words * 3, {"max_new_tokens": 20, "speculate": 0}),
        ("request one", words * 3, {"max_new_tokens": 20, "speculate": 1}),
    ]


def make_runner(tokenizer, words) -> FakeRunner:
    eos = tokenizer.eos_token_id
    marker, plain = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in ("A", "Z"))
    a, b, c = words[:3]
    return FakeRunner(words, per_prompt={marker: [a, b, eos, c], plain: list(range(1000, 1100))})


def run_workload(tokenizer, words, speculate: int):
    """Every request of the workload at once; per name: the events, and the request id; the runner."""
    runner = make_runner(tokenizer, words)
    engine = make_engine(tokenizer, runner, speculate=speculate)
    try:
        out, ids = {}, {}
        collectors = {}
        for name, prompt, params in workload(tokenizer, words):
            if not speculate:  # a request's speculate must be within the server's: none without speculation
                params = {k: v for k, v in params.items() if k != "speculate"}
            collectors[name] = Collector()
            ids[name] = engine.submit(engine.validate(prompt, params), collectors[name]).request_id
        for name, c in collectors.items():
            assert isinstance(c.wait_end(), FinalEvent), name
            out[name] = c.seen
        stats = engine.stats()
        assert stats.kv_blocks_free == stats.kv_blocks_total  # nothing leaked, rejected drafts included
        engine.kv.check()
        return out, ids, runner, engine.scheduler
    finally:
        engine.shutdown()


def summary(events) -> tuple:
    tokens = [(e.index, e.token.id, e.token.text, e.token.logprob, e.last, [t.id for t in e.top_tokens])
              for e in events if isinstance(e, TokenEvent)]
    final = events[-1]
    return tokens, final.token_ids, final.generated_text, final.finish_reason, final.generated_tokens


def test_events_are_token_for_token_those_without_speculation(tokenizer, words):
    """Every accepted token is its own TokenEvent, in order, the last one flagged, then exactly one final
    event; tokens, texts and finish reasons equal speculate=0's on the same script, with far fewer steps."""
    plain, _, plain_runner, _ = run_workload(tokenizer, words, speculate=0)
    spec, ids, spec_runner, scheduler = run_workload(tokenizer, words, speculate=SPECULATE)
    for name, events in spec.items():
        assert summary(events) == summary(plain[name]), name
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        assert [e.index for e in tokens] == list(range(len(tokens))), name
        assert [e.last for e in tokens] == [False] * (len(tokens) - 1) + [True], name
        assert sum(isinstance(e, FinalEvent) for e in events) == 1 and isinstance(events[-1], FinalEvent)
        final = events[-1]
        assert "".join(e.token.text for e in tokens) == final.generated_text, name
    assert scheduler.num_accepted_tokens > 0 and scheduler.num_drafts > 0
    assert scheduler.num_accepted_tokens <= scheduler.num_draft_tokens
    assert len(spec_runner.plans) < len(plain_runner.plans)
    # Every plan keeps the order the runner relies on, and every verify feeds [last token, *drafts].
    for plan in spec_runner.plans:
        assert [kind(e) for e in plan.seqs] == sorted(kind(e) for e in plan.seqs)
        for e in plan.seqs:
            assert e.num_drafts <= SPECULATE
            if e.num_drafts:
                assert e.is_decode and e.samples and len(e.token_ids) == 1 + e.num_drafts
    drafted = {name: max((e.num_drafts for p in spec_runner.plans for e in p.seqs if e.request_id == rid),
                         default=0) for name, rid in ids.items()}
    assert drafted["length"] == SPECULATE
    assert drafted["never repeats"] == 0
    assert drafted["request off"] == 0  # `speculate: 0` in the request turns it off for that request only
    assert drafted["request one"] == 1
    assert drafted["one"] == 0  # a single token: nothing to guess


def test_stops_inside_an_accepted_run_emit_nothing_past_them(tokenizer, words):
    """The step that ends a request accepted more drafts than the request keeps: the stop sequence / the
    end-of-sequence token is the last event, and the final event counts only kept tokens."""
    spec, ids, runner, _ = run_workload(tokenizer, words, speculate=SPECULATE)
    for name, finish, kept in (("stop", "stop_sequence", 3), ("eos", "eos_token", 3)):
        final = spec[name][-1]
        assert final.finish_reason.value == finish and final.generated_tokens == kept, name
        assert [e.index for e in spec[name] if isinstance(e, TokenEvent)] == list(range(kept))
        entries = [e for p in runner.plans for e in p.seqs if e.request_id == ids[name]]
        assert len(entries) == 2, name  # the prompt, then one verify whose 4 drafts were all accepted
        prompt, verify = entries
        assert verify.is_decode and verify.start == prompt.end and verify.num_drafts == SPECULATE, name
    eos_final = spec["eos"][-1]
    assert eos_final.token_ids[-1] == tokenizer.eos_token_id
    assert spec["stop"][-1].generated_text.endswith(" brown")
    assert spec["stop late"][-1].generated_text.endswith(" fox jumps the quick")


def test_accepted_draft_counts_only_cover_kept_tokens(tokenizer, words):
    """The final event's draft counters describe the request's output: its accepted draft tokens are
    generated tokens other than the first (which the prompt's step sampled)."""
    spec, _, _, scheduler = run_workload(tokenizer, words, speculate=SPECULATE)
    finals = {name: events[-1] for name, events in spec.items()}
    assert finals["length"].accepted_draft_tokens > 0
    assert finals["never repeats"].draft_tokens == finals["request off"].draft_tokens == 0
    for name, final in finals.items():
        assert final.accepted_draft_tokens <= final.draft_tokens, name
        assert final.accepted_draft_tokens <= max(final.generated_tokens - 1, 0), (name, final.accepted_draft_tokens,
                                                                                   final.generated_tokens)
    assert sum(f.draft_tokens for f in finals.values()) == scheduler.num_draft_tokens


def test_request_level_speculate_is_validated_against_the_server_limit(tokenizer, words):
    engine = make_engine(tokenizer, FakeRunner(words), speculate=2)
    off = make_engine(tokenizer, FakeRunner(words), speculate=0)
    try:
        assert engine.validate("hi", {"speculate": 2}).speculate == 2
        assert engine.validate("hi", {"speculate": 0}).speculate == 0
        assert engine.validate("hi").speculate is None
        for bad in (3, -1, 100):
            with pytest.raises(ValidationError, match="speculate"):
                engine.validate("hi", {"speculate": bad})
        with pytest.raises(ValidationError, match="speculate"):
            off.validate("hi", {"speculate": 1})
        assert off.validate("hi", {"speculate": 0}).speculate == 0
    finally:
        engine.shutdown()
        off.shutdown()


def test_a_server_speculate_out_of_range_is_refused():
    from tgi_llm.engine.limits import MAX_SPECULATE

    for bad in (-1, MAX_SPECULATE + 1):
        with pytest.raises(ArgumentValidationError, match="speculate"):
            resolve_limits(LimitOptions(**LIMITS, speculate=bad), None, None)
    assert resolve_limits(LimitOptions(**LIMITS, speculate=MAX_SPECULATE), None, None).speculate == MAX_SPECULATE
