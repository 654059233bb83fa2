"""Sampler: TGI's per-request logits pipeline, vectorised, checked against per-row references."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from tgi_llm.engine.logits_processors import apply_typical_p
from tgi_llm.engine.sampling import (
    PenaltyState,
    Sampler,
    make_generator,
    process_logits,
    samples,
    uses_penalty,
)
from tgi_llm.request import SamplingParams

GREEDY = SamplingParams()


def _logits(batch: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _generators(params: list[SamplingParams]) -> list[torch.Generator]:
    return [make_generator(p.seed) for p in params]


def _reference_scores(row: torch.Tensor, p: SamplingParams, seen: list[int]) -> torch.Tensor:
    """One request at a time, with transformers' own processors (and the frequency formula by hand)."""
    s = row[None].clone()
    if p.repetition_penalty != 1.0:
        s = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(torch.tensor([seen]), s)
    if p.frequency_penalty != 0.0:
        for token, n in Counter(seen).items():
            s[0, token] -= p.frequency_penalty * n
    if p.presence_penalty != 0.0:
        for token in set(seen):
            s[0, token] -= p.presence_penalty
    if samples(p):
        warpers = []
        if p.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(p.temperature))
        if p.top_k:
            warpers.append(TopKLogitsWarper(p.top_k))
        if p.top_p < 1.0:
            warpers.append(TopPLogitsWarper(p.top_p))
        if p.typical_p < 1.0:
            warpers.append(TypicalLogitsWarper(p.typical_p))
        for w in warpers:
            s = w(None, s)
    return s[0]


def test_greedy_is_bit_identical_to_argmax_and_does_not_touch_logits():
    logits = _logits(6, 500)
    before = logits.clone()
    out = Sampler()(logits, [GREEDY] * 6, [None] * 6)
    assert torch.equal(out.next_token_ids, logits.argmax(-1))
    assert torch.equal(
        out.logprobs, torch.log_softmax(logits, -1).gather(1, logits.argmax(-1)[:, None])[:, 0]
    )
    assert out.top_token_ids is None and out.top_logprobs is None
    assert torch.equal(logits, before)


def test_greedy_rows_unaffected_by_sampling_rows_beside_them():
    logits = _logits(5, 400, seed=1)
    params = [
        GREEDY,
        SamplingParams(do_sample=True, temperature=0.5, top_p=0.8, seed=3),
        GREEDY,
        SamplingParams(do_sample=True, top_k=4, typical_p=0.7, seed=4),
        GREEDY,
    ]
    before = logits.clone()
    out = Sampler()(logits, params, _generators(params))
    greedy = [0, 2, 4]
    assert torch.equal(out.next_token_ids[greedy], logits[greedy].argmax(-1))
    assert torch.equal(logits, before)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(do_sample=True, top_k=1),
        SamplingParams(do_sample=True, top_p=1e-6),
        SamplingParams(do_sample=True, temperature=1.7, top_k=1, top_p=0.95),
    ],
)
def test_degenerate_sampling_equals_greedy(params: SamplingParams):
    logits = _logits(8, 300, seed=2)
    rows = [SamplingParams(**{**params.__dict__, "seed": s}) for s in range(8)]
    out = Sampler()(logits, rows, _generators(rows))
    assert torch.equal(out.next_token_ids, logits.argmax(-1))
    # Only one token survives, so it has all the probability mass.
    torch.testing.assert_close(out.logprobs, torch.zeros(8))


def test_temperature_alone_samples_as_in_tgi():
    assert samples(SamplingParams(temperature=0.7))
    assert samples(SamplingParams(top_k=5)) and samples(SamplingParams(typical_p=0.5))
    assert not samples(SamplingParams()) and not samples(SamplingParams(repetition_penalty=1.3))
    assert uses_penalty(SamplingParams(frequency_penalty=0.1)) and not uses_penalty(SamplingParams(top_k=3))


def test_penalties_by_hand():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    state = PenaltyState(vocab_size=4)
    state.add("r", [0, 1, 0])  # token 0 twice, token 1 once
    counts = state.counts(["r"])
    rep = process_logits(logits, [SamplingParams(repetition_penalty=2.0)], counts)
    assert rep.tolist() == [[1.0, -4.0, 1.0, 0.5]]
    freq = process_logits(logits, [SamplingParams(frequency_penalty=0.5)], counts)
    assert freq.tolist() == [[1.0, -2.5, 1.0, 0.5]]
    both = process_logits(logits, [SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5)], counts)
    assert both.tolist() == [[0.0, -4.5, 1.0, 0.5]]  # repetition first, then frequency (TGI's order)
    pres = process_logits(logits, [SamplingParams(presence_penalty=0.5)], counts)
    assert pres.tolist() == [[1.5, -2.5, 1.0, 0.5]]  # once per seen token, whatever its count
    # A greedy penalised row picks the argmax of the penalised scores.
    out = Sampler()(logits, [SamplingParams(repetition_penalty=4.0)], [None], counts)
    assert out.next_token_ids.tolist() == [2]


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.tensor([[0.0, 0.0, 0.6931472, -1.0e4]])  # probabilities 0.25, 0.25, 0.5, 0 (exactly)
    kept = [process_logits(logits, [SamplingParams(top_p=p)]).isfinite()[0].tolist() for p in (0.5, 0.6, 0.9)]
    assert kept[0] == [False, False, True, False]  # 0.5 alone reaches top_p=0.5
    assert kept[1][2] and sum(kept[1]) == 2  # one of the tied 0.25 tokens joins the 0.5 one
    assert kept[2] == [True, True, True, False]


def test_process_logits_matches_per_row_reference():
    vocab = 300
    params = [
        GREEDY,
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(frequency_penalty=0.4),
        SamplingParams(do_sample=True, temperature=0.7, top_k=20, seed=1),
        SamplingParams(do_sample=True, top_p=0.85, repetition_penalty=1.1, frequency_penalty=0.2, seed=2),
        SamplingParams(do_sample=True, typical_p=0.6, seed=3),
        SamplingParams(presence_penalty=-0.7, frequency_penalty=0.1),
        SamplingParams(do_sample=True, temperature=1.3, top_k=50, top_p=0.9, typical_p=0.95, seed=4),
        SamplingParams(do_sample=True, top_k=vocab + 10, seed=5),  # k beyond the vocabulary: no-op
    ]
    logits = _logits(len(params), vocab, seed=3)
    rng = torch.Generator().manual_seed(5)
    state = PenaltyState(vocab, capacity=2)  # grows while adding
    seen: dict[int, list[int]] = {}
    for i, p in enumerate(params):
        if uses_penalty(p):
            seen[i] = torch.randint(0, vocab, (40,), generator=rng).tolist()
            state.add(i, seen[i][:30])
    state.record(list(seen), torch.tensor([s[30] for s in seen.values()]))  # one generated token each
    for i in seen:
        seen[i] = seen[i][:31]
    scores = process_logits(logits, params, state.counts(range(len(params))))
    for i, p in enumerate(params):
        expected = _reference_scores(logits[i], p, seen.get(i, []))
        assert torch.equal(scores[i].isinf(), expected.isinf()), i
        torch.testing.assert_close(scores[i], expected, msg=f"row {i}")
    # Rows with nothing to do are the raw logits, bit for bit.
    assert torch.equal(scores[0], logits[0])


def test_typical_p_matches_transformers_on_random_logits():
    masses = [0.05, 0.3, 0.6, 0.9, 0.99, 0.999]
    for seed in range(5):
        logits = _logits(len(masses), 1000, seed=seed)
        ours = apply_typical_p(logits, masses)
        for i, m in enumerate(masses):
            expected = TypicalLogitsWarper(m)(None, logits[i : i + 1])[0]
            assert torch.equal(ours[i], expected), (seed, m)


def test_same_seed_same_tokens_whatever_the_batch():
    vocab, steps = 200, 15
    target = SamplingParams(do_sample=True, temperature=0.9, top_p=0.95, seed=42)
    others = [
        GREEDY,
        SamplingParams(do_sample=True, top_k=5, seed=7),
        SamplingParams(do_sample=True, typical_p=0.5, repetition_penalty=1.2, seed=9),
        SamplingParams(frequency_penalty=0.3),
    ]

    def run(batch: list[SamplingParams], row: int) -> list[int]:
        gens = _generators(batch)
        state = PenaltyState(vocab)
        for i, p in enumerate(batch):
            if uses_penalty(p):
                state.add(i, [1, 2, 3])
        tokens = []
        for step in range(steps):
            logits = _logits(len(batch), vocab, seed=1000 + step)
            logits[row] = _logits(1, vocab, seed=step)[0]  # the target always sees the same logits
            out = Sampler()(logits, batch, gens, state.counts(range(len(batch))))
            state.record(range(len(batch)), out.next_token_ids)
            tokens.append(int(out.next_token_ids[row]))
        return tokens

    alone = run([target], 0)
    embedded = run(others[:2] + [target] + others[2:], 2)
    assert alone == embedded
    assert run([SamplingParams(**{**target.__dict__, "seed": 43})], 0) != alone


def test_draws_follow_the_distribution_and_respect_top_k():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    n = 2000
    logits = probs.log().expand(n, 4).contiguous()
    params = [SamplingParams(do_sample=True, seed=s) for s in range(n)]
    out = Sampler()(logits, params, _generators(params))
    freq = torch.bincount(out.next_token_ids, minlength=4).float() / n
    torch.testing.assert_close(freq, probs, atol=0.035, rtol=0)

    params = [SamplingParams(do_sample=True, top_k=2, seed=s) for s in range(n)]
    out = Sampler()(logits, params, _generators(params))
    counts = torch.bincount(out.next_token_ids, minlength=4)
    assert counts[:2].sum() == 0
    assert abs(counts[2].item() / n - 3 / 7) < 0.035


def test_logprobs_and_top_tokens():
    vocab = 50
    params = [
        GREEDY,
        SamplingParams(do_sample=True, top_k=10, seed=1),
        SamplingParams(do_sample=True, seed=2),
    ]
    logits = _logits(3, vocab, seed=4)
    out = Sampler()(logits, params, _generators(params), top_n=vocab)
    assert out.top_logprobs.shape == (3, vocab) and out.top_token_ids.dtype == torch.int64
    torch.testing.assert_close(out.top_logprobs.exp().sum(-1), torch.ones(3))
    assert torch.all(out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:])  # best first
    for i in range(3):
        pos = (out.top_token_ids[i] == out.next_token_ids[i]).nonzero()[0, 0]
        assert out.top_logprobs[i, pos] == out.logprobs[i]
    assert out.top_token_ids[0, 0] == out.next_token_ids[0]
    assert torch.isinf(out.top_logprobs[1, 10:]).all()  # top_k=10 leaves 10 tokens
    assert out.logprobs.dtype == torch.float32 and out.next_token_ids.dtype == torch.int64

    small = Sampler()(logits, params, _generators(params), top_n=3)
    expected = torch.log_softmax(process_logits(logits, params), -1).topk(3)
    assert torch.equal(small.top_token_ids, expected.indices)
    assert torch.equal(small.top_logprobs, expected.values)


def test_rows_without_sorting_warpers_never_sort(monkeypatch):
    def no_sort(*args, **kwargs):
        raise AssertionError("sorted although no row uses top_p or typical_p")

    monkeypatch.setattr(torch, "sort", no_sort)
    params = [GREEDY, SamplingParams(do_sample=True, temperature=0.8, top_k=5, seed=1)]
    Sampler()(_logits(2, 100), params, _generators(params))


def test_penalised_row_without_counts_is_an_error():
    with pytest.raises(ValueError, match="PenaltyState"):
        Sampler()(_logits(1, 10), [SamplingParams(repetition_penalty=1.2)], [None])


def test_penalty_state_counts_prompt_and_generated_tokens():
    state = PenaltyState(vocab_size=10, capacity=1)
    state.add("a", [1, 1, 3, 42])  # 42: beyond the vocabulary, ignored
    state.add("b", [2])  # grows the pool, keeps a's counts
    state.record(["a", "untracked", "b"], torch.tensor([3, 5, 2]))
    a, missing, b = state.counts(["a", "untracked", "b"])
    assert missing is None and "untracked" not in state and len(state) == 2
    assert a.tolist() == torch.bincount(torch.tensor([1, 1, 3, 3]), minlength=10).float().tolist()
    assert b.tolist() == torch.bincount(torch.tensor([2, 2]), minlength=10).float().tolist()
    with pytest.raises(KeyError):
        state.add("a", [])
    state.remove("a")
    state.add("c", [4])  # reuses a's row, which starts from zero
    assert state.counts(["c"])[0].tolist() == torch.bincount(torch.tensor([4]), minlength=10).float().tolist()
