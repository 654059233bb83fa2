"""Our paged forward against transformers' eager one: the helpers the model tests share."""

from __future__ import annotations

import torch

from tgi_llm.kv_cache import allocate_kv_cache


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def reference_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()


@torch.no_grad()
def reference_logits(ref, tokens: list[int]) -> torch.Tensor:
    return ref(torch.tensor([tokens])).logits[0]


class PagedRun:
    """A model plus its own KV cache and batcher: one `step` is one flat mixed forward."""

    def __init__(self, model, config, batcher) -> None:
        self.model = model
        self.batcher = batcher
        self.caches = allocate_kv_cache(config, batcher.num_blocks, batcher.block_size)

    def step(self, chunks: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Logits of every new token, split per sequence."""
        ids, positions, attn = self.batcher.step(chunks)
        logits = self.model.compute_logits(self.model(ids, positions, self.caches, attn))
        assert logits.dtype == torch.float32
        return list(logits.split(attn.query_lens_cpu))


def random_prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def assert_schedule_matches(run: PagedRun, ref, full: list[list[int]], schedule: list[list[tuple[int, int]]]) -> None:
    """Feed `full`'s sequences through `run` step by step (`schedule`: per step, (sequence, how many of its next
    tokens)); every new token's logits must be transformers' at that position of the sequence so far."""
    done = [0] * len(full)
    got: dict[int, list[torch.Tensor]] = {s: [] for s in range(len(full))}
    for step in schedule:
        chunks = [(s, full[s][done[s] : done[s] + n]) for s, n in step]
        for (s, n), logits in zip(step, run.step(chunks), strict=True):
            got[s].append(logits)
            done[s] += n
    for s, tokens in enumerate(full):
        assert rel_err(torch.cat(got[s]), reference_logits(ref, tokens[: done[s]])) < 1e-4, s


def assert_greedy_is_transformers_choice(ref, prompts: list[list[int]], outputs: list[list[int]]) -> None:
    """Each generated token is transformers' top choice after the prompt and the tokens before it, or within a
    near-tie (1e-4 of the largest logit) of it: random weights give near-ties."""
    for prompt, out in zip(prompts, outputs, strict=True):
        logits = reference_logits(ref, prompt + out)[len(prompt) - 1 : -1]
        chosen = logits.gather(1, torch.tensor(out)[:, None])[:, 0]
        assert bool((chosen >= logits.max(dim=1).values - 1e-4 * logits.abs().max()).all()), out
