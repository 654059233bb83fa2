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
