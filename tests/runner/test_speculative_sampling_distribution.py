"""Verifying draft tokens does not change what sampling draws, on a tiny random model (vocabulary 32) at
the runner level. Over 3000 seeds, the token chosen at the row that verifies a draft follows the target
distribution (softmax of the model's warped logits there), the draft is accepted exactly when that token
is the draft (so with probability p(draft)), and the row after an accepted draft follows the distribution
after it: chi-square tests at p = 0.001 without scipy (categories expected under 5 times merged). And
per seed, a verify then plain steps choose exactly the tokens of plain steps alone (noise rows in order,
penalties counting accepted drafts)"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch

from tgi_llm.engine.step_plan import ScheduledSeq, StepPlan
from tgi_llm.kv_cache import allocate_kv_cache
from tgi_llm.models.loader import load_model
from tgi_llm.request import SamplingParams, StoppingParams, ValidRequest
from tgi_llm.runner.model_runner import ModelRunner

VOCAB, BLOCK, BATCH, SEEDS = 32, 16, 500, 3000
PROMPT = [3, 5, 7, 9, 11, 13, 15, 17]
Z_0001 = 3.090232  # the standard normal's upper 0.001 quantile


@pytest.fixture(scope="module")
def model(tiny_model_factory):
    return load_model(tiny_model_factory("llama", seed=3, vocab_size=VOCAB))


def fresh_runner(model) -> ModelRunner:
    net, config = model
    return ModelRunner(net, allocate_kv_cache(config, BATCH, BLOCK), BLOCK, config.vocab_size, torch.device("cpu"))


def request(params: SamplingParams) -> ValidRequest:
    return ValidRequest(tuple(PROMPT), params, StoppingParams(max_new_tokens=8))


def target(runner: ModelRunner, tokens: list[int], params: SamplingParams) -> torch.Tensor:
    """The distribution a step samples from after `tokens`: the model's logits there, warped as the
    sampler warps them (temperature, top_k), softmaxed."""
    _, logits = runner.forward_plan(StepPlan([ScheduledSeq(0, 0, tokens, [0], samples=True)]))
    warped = logits.double() / params.temperature  # computed here, not by the sampler under test
    if params.top_k:
        kth = warped.topk(params.top_k, dim=-1).values[:, -1:]
        warped = warped.masked_fill(warped < kth, float("-inf"))
    return torch.softmax(warped[0], dim=-1)


def greedy(runner: ModelRunner, params: SamplingParams, n: int) -> list[int]:
    """The first n tokens one request chooses after the prompt, one step each."""
    tokens: list[int] = []
    req = request(params)
    for _ in range(n):
        start = len(PROMPT) + len(tokens) - 1 if tokens else 0
        entry = ScheduledSeq(1, start, [tokens[-1]] if tokens else PROMPT, [0], samples=True,
                             is_decode=bool(tokens), request=req)
        (result,) = runner.execute(StepPlan([entry]))
        tokens.append(result.tokens[0].token_id)
    return tokens


def with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return SamplingParams(**{**params.__dict__, "seed": seed})


def verify_all(runner: ModelRunner, drafts: list[int], params: SamplingParams, seeds: int = SEEDS) -> list[list[int]]:
    """For every seed, one step that feeds the prompt and the drafts (num_drafts=len(drafts)): the tokens
    it chose."""
    out = []
    for first in range(0, seeds, BATCH):
        plan = StepPlan([ScheduledSeq(10_000 + s, 0, [*PROMPT, *drafts], [j], samples=True, is_decode=True,
                                      num_drafts=len(drafts), request=request(with_seed(params, s)))
                         for j, s in enumerate(range(first, min(first + BATCH, seeds)))])
        for result in runner.execute(plan):
            assert result is not None and result.num_drafts == len(drafts)
            out.append([t.token_id for t in result.tokens])
    return out


def chi_square(counts: list[int], probs: list[float]) -> tuple[float, int]:
    """The statistic and its degrees of freedom; categories expected under 5 times are merged (smallest
    first) until every bucket expects at least 5. A count in a category of probability 0 is infinite."""
    n = sum(counts)
    cells = sorted(zip((p * n for p in probs), counts, strict=True))
    if any(e == 0 and c > 0 for e, c in cells):
        return math.inf, 1
    cells = [(e, c) for e, c in cells if e > 0]
    merged: list[tuple[float, int]] = []
    acc_e, acc_c = 0.0, 0
    for e, c in cells:
        acc_e, acc_c = acc_e + e, acc_c + c
        if acc_e >= 5:
            merged.append((acc_e, acc_c))
            acc_e, acc_c = 0.0, 0
    if acc_e > 0:  # a remainder under 5 joins the last bucket
        e, c = merged.pop() if merged else (0.0, 0)
        merged.append((e + acc_e, c + acc_c))
    stat = sum((c - e) ** 2 / e for e, c in merged)
    return stat, len(merged) - 1


def critical(df: int) -> float:
    """The chi-square upper 0.001 quantile (Wilson-Hilferty; within 3% from 1 degree of freedom up)."""
    k = 2.0 / (9.0 * df)
    return df * (1.0 - k + Z_0001 * math.sqrt(k)) ** 3


def assert_follows(counts: list[int], probs: torch.Tensor, what: str) -> None:
    stat, df = chi_square(counts, probs.tolist())
    assert df >= 3, (what, df)  # the test has power: several categories
    assert stat < critical(df), (what, stat, df, critical(df), counts)


def test_chi_square_helper_rejects_a_wrong_distribution():
    """The statistic can fail: counts drawn from one distribution pass against it and fail against a
    tilted one."""
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(VOCAB, generator=gen, dtype=torch.float64), dim=0)
    draws = torch.multinomial(p, SEEDS, replacement=True, generator=gen)
    counts = torch.bincount(draws, minlength=VOCAB).tolist()
    stat, df = chi_square(counts, p.tolist())
    assert stat < critical(df)
    tilted = p.clone()
    tilted[p.argmax()] *= 0.6
    stat, df = chi_square(counts, (tilted / tilted.sum()).tolist())
    assert stat > critical(df)
    assert abs(critical(1) - 10.828) < 0.35 and abs(critical(30) - 59.703) < 0.3


@pytest.mark.parametrize("params", [
    SamplingParams(do_sample=True, temperature=0.6),
    SamplingParams(do_sample=True, temperature=0.8, top_k=6),
], ids=["temperature", "top_k"])
def test_a_verified_draft_row_samples_the_target_distribution(model, params):
    runner = fresh_runner(model)
    p0 = target(runner, PROMPT, params)
    draft = int(p0.argmax())
    p1 = target(runner, [*PROMPT, draft], params)
    chosen = verify_all(runner, [draft], params)

    firsts = [c[0] for c in chosen]
    # The draft is accepted exactly when the verifying row chose it; then one more token follows it.
    assert all(len(c) == (2 if c[0] == draft else 1) for c in chosen)
    assert_follows(torch.bincount(torch.tensor(firsts), minlength=VOCAB).tolist(), p0, "verifying row")

    accepted = sum(f == draft for f in firsts) / SEEDS
    p_draft = p0[draft].item()
    sigma = math.sqrt(p_draft * (1 - p_draft) / SEEDS)
    assert abs(accepted - p_draft) < 4.5 * sigma, (accepted, p_draft)
    assert 0.05 < p_draft < 0.95  # neither always nor never: the acceptance check has power

    seconds = [c[1] for c in chosen if len(c) == 2]
    assert len(seconds) > 200
    assert_follows(torch.bincount(torch.tensor(seconds), minlength=VOCAB).tolist(), p1, "row after the draft")


@pytest.mark.parametrize("params, n_drafts", [
    (SamplingParams(do_sample=True, temperature=0.6), 1),
    (SamplingParams(do_sample=True, temperature=0.6), 3),
    (SamplingParams(do_sample=True, temperature=0.7, frequency_penalty=1.5), 3),
    (SamplingParams(do_sample=True, temperature=0.7, repetition_penalty=2.0, top_k=8), 3),
], ids=["one draft", "three drafts", "frequency penalty", "repetition penalty"])
def test_each_seed_chooses_what_steps_without_speculation_choose(model, params, n_drafts):
    """The same seed, one token per step (no drafts), against a verify step and then plain steps: the
    first n_drafts + 1 tokens are equal, whether the drafts were accepted or not (a rejected verify gives
    its unused noise rows back for the next steps' tokens). The drafts are the greedy continuation under
    the same penalties, so they are often accepted, and a penalty must count each accepted draft before
    the next row."""
    spec_runner, plain_runner = fresh_runner(model), fresh_runner(model)
    drafts = greedy(fresh_runner(model), replace(params, do_sample=False, temperature=1.0, top_k=0), n_drafts)
    reqs = {s: request(with_seed(params, s)) for s in range(BATCH)}
    spec = dict(enumerate(verify_all(spec_runner, drafts, params, seeds=BATCH)))
    plain: dict[int, list[int]] = {s: [] for s in reqs}
    want = n_drafts + 1

    def step(runner: ModelRunner, key: int, tokens: dict[int, list[int]]) -> None:
        """One token more for every seed that has fewer than `want`: feed the last one (the prompt at first)."""
        entries = []
        for s, got in tokens.items():
            if len(got) < want:
                start = len(PROMPT) + len(got) - 1 if got else 0
                fed = [got[-1]] if got else PROMPT
                entries.append(ScheduledSeq(key + s, start, fed, [s], samples=True, is_decode=bool(got),
                                            request=reqs[s]))
        if not entries:
            return
        for entry, result in zip(entries, runner.execute(StepPlan(entries)), strict=True):
            tokens[entry.request_id - key].extend(t.token_id for t in result.tokens)

    for _ in range(want):
        step(plain_runner, 20_000, plain)
        step(spec_runner, 10_000, spec)
    assert {s: t[:want] for s, t in spec.items()} == plain
    same = [list(itertools.takewhile(lambda pair: pair[0] == pair[1], zip(plain[s], drafts, strict=False)))
            for s in reqs]
    accepted = [len(run) for run in same]
    assert 0 < accepted.count(0) < BATCH  # rejected and accepted verifies both happened
    if n_drafts > 1:
        assert sum(a >= 2 for a in accepted) >= 5  # rows after accepted drafts were chosen from
