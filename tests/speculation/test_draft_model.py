"""`--speculative-model`: a draft model's greedy guesses, verified by the target, leave output exactly what
`--speculate 0` gives (greedy and seeded), whether the draft is always right (the target itself) or mostly
wrong (a random model with the same tokenizer); a draft with another tokenizer is refused at start-up."""

from __future__ import annotations

import pytest

from tgi_llm.errors import ArgumentValidationError
from tgi_llm.llm import LLM

from .always_pays import AlwaysPays

pytestmark = pytest.mark.slow

LIMITS = dict(max_input_tokens=256, max_total_tokens=384, max_batch_total_tokens=4096)
PROMPTS = ["The three primary colors of light are", "Repeat after me: one two three four five six seven",
           "def fibonacci(n):"]
GREEDY = {"max_new_tokens": 24}
SAMPLED = {"max_new_tokens": 24, "do_sample": True, "temperature": 0.9, "top_p": 0.95, "seed": 11}


@pytest.fixture(scope="module")
def plain(default_model_dir):
    with LLM(str(default_model_dir), **LIMITS) as llm:
        yield {name: [r.token_ids for r in llm.generate(PROMPTS, params)]
               for name, params in (("greedy", GREEDY), ("sampled", SAMPLED))}


def _speculating(model_dir, draft_dir, **options) -> LLM:
    llm = LLM(str(model_dir), speculative_model=str(draft_dir), **(options or LIMITS))
    llm.engine.scheduler.speculation = AlwaysPays(llm.engine.limits.speculate)
    return llm


def test_the_target_as_its_own_draft_is_always_accepted(default_model_dir, plain):
    with _speculating(default_model_dir, default_model_dir) as llm:
        assert llm.engine.limits.speculate == 4  # the default with a draft model
        greedy = llm.generate(PROMPTS, GREEDY)
        assert [r.token_ids for r in greedy] == plain["greedy"]
        for r in greedy:
            assert r.final.draft_tokens > 0 and r.final.accepted_draft_tokens == r.final.draft_tokens
        sampled = llm.generate(PROMPTS, SAMPLED)
        assert [r.token_ids for r in sampled] == plain["sampled"]
        assert llm.engine.kv.num_free == llm.engine.kv.num_blocks


def test_a_wrong_draft_changes_nothing_but_its_acceptance(default_model_dir, tiny_llama_dir, plain):
    with _speculating(default_model_dir, tiny_llama_dir) as llm:
        greedy = llm.generate(PROMPTS, GREEDY)
        assert [r.token_ids for r in greedy] == plain["greedy"]
        drafted = sum(r.final.draft_tokens for r in greedy)
        assert drafted > 0 and sum(r.final.accepted_draft_tokens for r in greedy) < drafted
        assert [r.token_ids for r in llm.generate(PROMPTS, SAMPLED)] == plain["sampled"]
        assert llm.engine.kv.num_free == llm.engine.kv.num_blocks


def test_a_draft_without_the_same_tokenizer_is_refused(default_model_dir, tiny_model_factory):
    with pytest.raises(ArgumentValidationError, match="`speculative_model`"):
        LLM(str(default_model_dir), speculative_model=str(tiny_model_factory()), **LIMITS)


def test_the_draft_s_kv_pool_takes_the_cache_type_and_its_guesses_hold(tiny_llama_dir):
    """--kv-cache-dtype float16: the draft's pool is float16 too, as many blocks as the target's; the model as
    its own draft reads its guesses' K/V back right (accepted), and output is what no draft gives."""
    import torch

    options = dict(kv_cache_memory_gb=0.05, kv_cache_dtype="float16")
    prompts = [list(range(20, 60)), "Hello, my name is"]
    params = {"max_new_tokens": 24, "ignore_eos": True}
    with LLM(str(tiny_llama_dir), **options) as llm:
        want = [r.token_ids for r in llm.generate(prompts, params)]
    with _speculating(tiny_llama_dir, tiny_llama_dir, **options) as llm:
        draft, target = llm.engine.scheduler.proposer.runner.kv_caches, llm.engine.runner.kv_caches
        assert all(t.dtype == torch.float16 for pair in draft for t in pair)
        assert draft[0][0].shape == target[0][0].shape  # the tiny model drafts for itself
        got = llm.generate(prompts, params)
    assert [r.token_ids for r in got] == want
    drafted = sum(r.final.draft_tokens for r in got)
    assert drafted > 0 and sum(r.final.accepted_draft_tokens for r in got) == drafted
