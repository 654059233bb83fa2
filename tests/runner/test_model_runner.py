"""The runner on the real default model: a prompt computed in chunks, or after a prefix-cache hit, gives
the logits of the prompt computed in one piece (the attention kernels read the cached context)."""

from __future__ import annotations

import pytest
import torch

from tgi_llm.kv_cache import allocate_kv_cache
from tgi_llm.models.loader import load_model
from tgi_llm.runner.model_runner import ModelRunner

from ..conftest import PlanPlayer

pytestmark = pytest.mark.slow

BLOCK, NUM_BLOCKS = 16, 96


@pytest.fixture(scope="module")
def model(default_model_dir):
    return load_model(default_model_dir)


def fresh_runner(model) -> ModelRunner:
    net, config = model
    return ModelRunner(net, allocate_kv_cache(config, NUM_BLOCKS, BLOCK), BLOCK, config.vocab_size,
                       torch.device("cpu"))


def logits_by_request(runner: ModelRunner, player: PlanPlayer, steps: int) -> dict[int, list[torch.Tensor]]:
    """Run `steps` plans; per request id, the logits rows it got (prompt rows, then sampled rows) in order."""
    rows: dict[int, list[torch.Tensor]] = {}
    for _ in range(steps):
        plan = player.plan()
        batch, logits = runner.forward_plan(plan)
        for i, offset, n in batch.prompt_logprob_rows:
            rows.setdefault(plan.seqs[i].request_id, []).extend(logits[offset : offset + n])
        for j, i in enumerate(batch.sample_seqs):
            rows.setdefault(plan.seqs[i].request_id, []).append(logits[j])
        player.advance(plan)
    return rows


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (150, 37, 96)]


@pytest.mark.parametrize("chunk", [16, 64, 100])
def test_chunked_prefill_gives_the_logits_of_the_whole_prompt(model, chunk):
    vocab = model[1].vocab_size
    runs = {}
    for step_tokens in (4096, chunk):
        player = PlanPlayer(BLOCK, NUM_BLOCKS, step_tokens=step_tokens, next_token=lambda i: 42 + i)
        for p in prompts(vocab):
            player.add(p, max_new_tokens=3, decoder_input_details=True)
        steps = 3 if step_tokens == 4096 else -(-sum(map(len, prompts(vocab))) // chunk) + 2
        runs[step_tokens] = logits_by_request(fresh_runner(model), player, steps)
    whole, chunked = runs[4096], runs[chunk]
    for request_id, want in whole.items():
        got = chunked[request_id]
        assert len(got) >= len(want) - 2  # every prompt row and the first sampled row at least
        for g, w in zip(got, want, strict=False):
            assert rel_err(g, w) < 1e-4


def test_a_prefix_cache_hit_gives_the_logits_of_the_uncached_prompt(model):
    vocab = model[1].vocab_size
    system, question = prompts(vocab)[0], prompts(vocab)[1]
    runner = fresh_runner(model)
    player = PlanPlayer(BLOCK, NUM_BLOCKS)
    player.add(system + [5, 6, 7], max_new_tokens=1)
    logits_by_request(runner, player, 1)
    seq = player.add(system + question, max_new_tokens=1)
    cached = logits_by_request(runner, player, 1)[seq.request_id]
    assert seq.num_cached == 144  # the system prompt's 9 full blocks

    uncached_player = PlanPlayer(BLOCK, NUM_BLOCKS, prefix_caching=False)
    other = uncached_player.add(system + question, max_new_tokens=1)
    uncached = logits_by_request(fresh_runner(model), uncached_player, 1)[other.request_id]
    assert rel_err(cached[-1], uncached[-1]) < 1e-4


def test_warm_up_checks_the_fused_stack_and_leaves_no_trace(model, prefill_kernel_chosen):
    """After warm_up the fused stack exists and has been compared on both kinds of step, so no request pays
    for that; the blocks it wrote (0 and 1) hold nothing a request later reads."""
    net, config = model
    warmed = fresh_runner(model)
    warmed.warm_up()
    fused = net._fused[1] if net._fused is not None else None
    assert fused is not None  # the default model on the CPU runs the fused stack (TGI_LLM_FUSED_DECODE unset)
    assert fused.checked == {"decode", "mixed", "verify"} and fused.agrees
    rows = {}
    for name, runner in (("warmed", warmed), ("cold", fresh_runner(model))):
        player = PlanPlayer(BLOCK, NUM_BLOCKS, next_token=lambda i: 42 + i)
        for p in prompts(config.vocab_size):
            player.add(p, max_new_tokens=3)
        rows[name] = logits_by_request(runner, player, 3)
    assert rows["warmed"].keys() == rows["cold"].keys()
    for request_id, want in rows["cold"].items():
        for got, w in zip(rows["warmed"][request_id], want, strict=True):
            assert rel_err(got, w) < 1e-4
