"""Speculative decoding on the real default model: with speculate=4 the output is token for token what
speculate=0 gives (greedy and seeded sampling; alone, batched, with stop sequences, a JSON grammar,
penalties, min_new_tokens, top-n logprobs, chunked prompts and prefix-cache hits), drafts were really
accepted, and no KV block leaks.

The `spec` server guesses at every decode that prompt lookup has a guess for (its break-even is pinned at
0, so which steps verify does not depend on measured step times): verification runs in every batch shape
these tests make. One test runs the engine's own policy."""

from __future__ import annotations

import json

import pytest

from tgi_llm import LLM
from tgi_llm.speculation import SpeculationPolicy

from ..speculation.always_pays import AlwaysPays

pytestmark = pytest.mark.slow

SPECULATE = 4
PASSAGE = ("The lighthouse keeper climbed the narrow stairs every evening at dusk, lit the great lamp, "
           "and wrote the weather, the passing ships and the state of the sea in a leather logbook.")
TASKS = [
    f"Repeat this text exactly: {PASSAGE}",
    "Copy the following sentence word for word: Paris is the capital of France and is known for the "
    "Eiffel Tower, the Louvre and its many cafes.",
    "Rewrite this list in the same order, one item per line: apples, oranges, bananas, grapes, pears, "
    "cherries, plums, mangoes.",
    "Fix the spelling in this sentence and repeat it: The quik brown fox jumpd over the lazzy dog near the "
    "quiet rivver bank.",
    "Translate into French: The cat is sleeping on the red chair in the kitchen.",
    "What is the capital of Italy?",
]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}


@pytest.fixture(scope="module")
def plain(default_model_dir):
    llm = LLM(None, kv_cache_memory_gb=0.25)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def spec(default_model_dir):
    llm = LLM(None, kv_cache_memory_gb=0.25, speculate=SPECULATE)
    llm.engine.scheduler.speculation = AlwaysPays(SPECULATE)  # before any request: the loop is idle
    yield llm
    llm.close()


@pytest.fixture(autouse=True)
def no_leaked_blocks(request):
    """After each test, every server it used has all its KV blocks back."""
    yield
    for name in ("plain", "spec"):
        if name in request.fixturenames:
            llm = request.getfixturevalue(name)
            assert llm.engine.kv.num_free == llm.engine.kv.num_blocks, name
            llm.engine.kv.check()


def chat(llm: LLM, text: str) -> list[int]:
    rendered = llm.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
    return llm.tokenizer(rendered, add_special_tokens=False)["input_ids"]


def accepted(llm: LLM) -> int:
    return llm.engine.scheduler.num_accepted_tokens


def assert_same(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids, (g.text, w.text)
        assert g.text == w.text and g.finish_reason == w.finish_reason


def test_greedy_tokens_are_those_without_speculation_alone_and_batched(plain, spec):
    prompts = [chat(plain, t) for t in TASKS]
    params = {"max_new_tokens": 64}
    want = [plain.generate([p], params)[0] for p in prompts]
    before = accepted(spec)
    alone = [spec.generate([p], params)[0] for p in prompts]
    assert_same(alone, want)
    assert accepted(spec) - before >= 20  # copying tasks: many guesses confirmed
    first = alone[0].final
    assert 0 < first.accepted_draft_tokens <= first.draft_tokens
    before = accepted(spec)
    assert_same(spec.generate(prompts, params), want)
    assert accepted(spec) > before  # verification also ran inside a batch
    assert_same(spec.generate(prompts[::-1], params), want[::-1])


def test_stop_sequences_end_where_they_end_without_speculation(plain, spec):
    prompts = [chat(plain, t) for t in TASKS[:4]]
    params = [{"max_new_tokens": 64, "stop": [stop]} for stop in (" sea", " Louvre", "pears", " quiet")]
    want = plain.generate(prompts, params)
    assert sum(r.finish_reason == "stop_sequence" for r in want) >= 2  # the stops are in the outputs
    before = accepted(spec)
    assert_same([spec.generate([p], q)[0] for p, q in zip(prompts, params, strict=True)], want)
    assert_same(spec.generate(prompts, params), want)
    assert accepted(spec) > before


RECORD = {"name": "Alice Martin", "age": 34, "city": "Lyon"}
JSON_TASKS = [f"Repeat this JSON exactly: {json.dumps(RECORD)}",
              "Give the person in this sentence as JSON: Bob Stone, 51, lives in Oslo.",
              f"Repeat this JSON exactly: {json.dumps({**RECORD, 'age': 'thirty-four'})}"]  # a draft it refuses
JSON_PARAMS = {"max_new_tokens": 64, "grammar": {"type": "json", "value": PERSON}}


def test_a_json_grammar_constrains_the_drafts_as_the_tokens(plain, spec):
    """Drafts copied from the prompt pass through the grammar's mask at each row (and a draft the grammar
    refuses ends the guess): the same JSON comes out."""
    prompts = [chat(plain, t) for t in JSON_TASKS]
    want = [plain.generate([p], JSON_PARAMS)[0] for p in prompts]
    before = accepted(spec)
    alone = [spec.generate([p], JSON_PARAMS)[0] for p in prompts]
    assert_same(alone, want)
    assert accepted(spec) > before
    for r in alone:
        assert r.finish_reason == "eos_token" and set(json.loads(r.text)) == set(PERSON["properties"])


def test_a_batch_of_constrained_requests_where_only_some_guess(plain, spec):
    """Constrained requests in one step, some verifying drafts and some not (nothing to guess yet, or
    `speculate: 0`): each gets its own rows' masks and the tokens it gets alone."""
    prompts = [chat(plain, t) for t in JSON_TASKS]
    params = [JSON_PARAMS, JSON_PARAMS, {**JSON_PARAMS, "speculate": 0}]
    want = [plain.generate([p], JSON_PARAMS)[0] for p in prompts]
    assert_same(spec.generate(prompts, params), want)
    assert_same(spec.generate(prompts, JSON_PARAMS), want)


@pytest.mark.parametrize("penalty", [{"repetition_penalty": 1.1}, {"frequency_penalty": 0.6},
                                     {"presence_penalty": 0.5, "repetition_penalty": 1.1}],
                         ids=["repetition", "frequency", "presence"])
def test_penalties_count_the_draft_tokens_before_each_row(plain, spec, penalty):
    prompts = [chat(plain, t) for t in TASKS[:4]]
    params = {"max_new_tokens": 48, **penalty}
    want = plain.generate(prompts, params)
    before = accepted(spec)
    assert_same([spec.generate([p], params)[0] for p in prompts], want)
    assert_same(spec.generate(prompts, params), want)
    assert accepted(spec) > before


def test_min_new_tokens_holds_back_an_end_of_sequence_draft(plain, spec):
    """The model copies a short text and ends it; the chat prompt has the end-of-turn token right after
    that text, so prompt lookup guesses the end. With min_new_tokens just below, at, just above and well
    above where the model ends, each row of a verify holds the end back exactly while a step without
    speculation would: the same tokens."""
    prompts = [chat(plain, "Repeat this text exactly: Good morning, dear friends."),
               chat(plain, "Repeat this text exactly: Blue whales are the largest animals on Earth.")]
    free = plain.generate(prompts, {"max_new_tokens": 40})
    assert all(r.finish_reason == "eos_token" for r in free)
    cases = [(p, {"max_new_tokens": 60, "min_new_tokens": r.generated_tokens + offset})
             for p, r in zip(prompts, free, strict=True) for offset in (-1, 0, 1, 8)]
    want = [plain.generate([p], q)[0] for p, q in cases]
    assert want[0].token_ids == free[0].token_ids  # below the model's own length: nothing held
    before = accepted(spec)
    got = [spec.generate([p], q)[0] for p, q in cases]
    assert_same(got, want)
    assert_same(spec.generate([p for p, _ in cases], [q for _, q in cases]), want)
    assert accepted(spec) > before
    eos = spec.engine.eos_token_ids
    for r, (_, q) in zip(got, cases, strict=True):
        assert r.generated_tokens >= q["min_new_tokens"]
        assert not any(t in eos for t in r.token_ids[: q["min_new_tokens"]])


def test_top_n_tokens_and_details_give_the_same_logprobs(plain, spec):
    prompts = [chat(plain, t) for t in TASKS[:3]]
    params = {"max_new_tokens": 40, "details": True, "top_n_tokens": 3}
    want = plain.generate(prompts, params)
    before = accepted(spec)
    for got in ([spec.generate([p], params)[0] for p in prompts], spec.generate(prompts, params)):
        assert_same(got, want)
        for g, w in zip(got, want, strict=True):
            for a, b in zip(g.final.tokens, w.final.tokens, strict=True):
                assert a.id == b.id and a.logprob == pytest.approx(b.logprob, rel=1e-5, abs=1e-5)
            assert len(g.final.top_tokens) == len(w.final.top_tokens) == g.generated_tokens
            for tops_g, tops_w in zip(g.final.top_tokens, w.final.top_tokens, strict=True):
                assert [t.id for t in tops_g] == [t.id for t in tops_w]
                # A verify's rows come from a multi-row forward: float32 sums grouped differently (seen:
                # 1.1e-5 at a logprob of -2.26).
                assert [t.logprob for t in tops_g] == pytest.approx([t.logprob for t in tops_w], rel=1e-5,
                                                                    abs=1e-5)
    assert accepted(spec) > before


def test_chunked_prompts_and_prefix_cache_hits(plain, default_model_dir):
    """Prompts prefilled 32 tokens at a time, each sent twice (the second finds its prompt cached): the
    same tokens as without speculation, alone and batched; nothing leaks."""
    prompts = [chat(plain, t) for t in TASKS[:4]]
    params = {"max_new_tokens": 48}
    want = plain.generate(prompts, params)
    with LLM(None, kv_cache_memory_gb=0.25, speculate=SPECULATE, max_batch_prefill_tokens=32) as llm:
        llm.engine.scheduler.speculation = AlwaysPays(SPECULATE)
        for p, w in zip(prompts, want, strict=True):
            first, second = llm.generate([p], params)[0], llm.generate([p], params)[0]
            assert_same([first, second], [w, w])
            assert second.final.cached_tokens >= 32
        assert_same(llm.generate(prompts + prompts, params), want + want)
        assert accepted(llm) > 0
        assert llm.engine.kv.num_free == llm.engine.kv.num_blocks
        llm.engine.kv.check()


@pytest.mark.parametrize("sampling", [{"temperature": 0.8, "top_p": 0.9}, {"temperature": 0.7, "top_k": 20,
                                                                            "repetition_penalty": 1.1}],
                         ids=["top_p", "top_k_penalty"])
def test_seeded_sampling_gives_the_tokens_without_speculation(plain, spec, sampling):
    """The same seed draws the same tokens: a verify uses the request's noise rows in order and gives back
    those past a rejection."""
    prompts = [chat(plain, t) for t in TASKS]
    params = [{"max_new_tokens": 48, "do_sample": True, "seed": 1000 + i, **sampling} for i in range(len(prompts))]
    want = plain.generate(prompts, params)
    got = [spec.generate([p], q)[0] for p, q in zip(prompts, params, strict=True)]
    assert_same(got, want)
    assert sum(r.final.accepted_draft_tokens for r in got) > 10
    assert_same(spec.generate(prompts, params), want)
    other_seed = plain.generate([prompts[5]], {**params[5], "seed": 7})[0]
    assert other_seed.token_ids != want[5].token_ids  # the seed drives the draws in these tests


def test_a_mixed_batch_gives_each_request_its_own_tokens(plain, spec):
    """Greedy, seeded, penalised, top-n and `speculate: 0` requests in one batch: each gets what it gets
    alone without speculation."""
    prompts = [chat(plain, t) for t in TASKS]
    params = [{"max_new_tokens": 48}, {"max_new_tokens": 48, "do_sample": True, "seed": 3, "temperature": 0.8},
              {"max_new_tokens": 48, "frequency_penalty": 0.4}, {"max_new_tokens": 48, "speculate": 0},
              {"max_new_tokens": 48, "top_n_tokens": 2, "details": True},
              {"max_new_tokens": 48, "do_sample": True, "seed": 4, "top_k": 10, "speculate": 2}]
    want = [plain.generate([p], {k: v for k, v in q.items() if k != "speculate"})[0]
            for p, q in zip(prompts, params, strict=True)]
    got = spec.generate(prompts, params)
    assert_same(got, want)
    assert got[3].final.draft_tokens == 0 and got[0].final.accepted_draft_tokens > 0


def test_the_engine_s_own_policy_speculates_for_one_stream(plain, spec):
    """With the fitted break-even (not pinned), a single copying stream still guesses and gets guesses
    confirmed, with the same tokens."""
    pinned = spec.engine.scheduler.speculation
    spec.engine.scheduler.speculation = SpeculationPolicy(SPECULATE)
    try:
        prompt = chat(plain, TASKS[0])
        params = {"max_new_tokens": 64}
        want = plain.generate([prompt], params)
        before = accepted(spec)
        for _ in range(3):  # the fit follows measured step times: a loaded host may hold guesses back a while
            assert_same(spec.generate([prompt], params), want)
            if accepted(spec) > before:
                break
        assert accepted(spec) > before
    finally:
        spec.engine.scheduler.speculation = pinned
