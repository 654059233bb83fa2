"""The paged KV cache tensors: allocation, writing new tokens, reading a sequence back.

Layout per layer: K and V each `[num_blocks, block_size, num_kv_heads, head_dim]` (flash-attn's
paged layout), so token slot `s` lives at `[s // block_size, s % block_size]`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # models imports the attention backends, which import this module
    from tgi_llm.models.config import ModelConfig

KVCache = list[tuple[torch.Tensor, torch.Tensor]]


def allocate_kv_cache(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> KVCache:
    """One (K, V) pair per layer. Zero-filled: attention masks padded slots, but a masked weight of
    0 times uninitialised NaN memory would still be NaN."""
    shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(config.num_hidden_layers)
    ]


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store new tokens' K/V ([T, Hkv, D]) at their slots."""
    num_blocks, block_size, heads, dim = k_cache.shape
    flat_k = k_cache.view(num_blocks * block_size, heads, dim)
    flat_v = v_cache.view(num_blocks * block_size, heads, dim)
    flat_k.index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    flat_v.index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The first `num_blocks` blocks of each row of `block_tables` ([B, >=num_blocks]) as one
    contiguous run per sequence: [B, num_blocks * block_size, Hkv, D]."""
    _, block_size, heads, dim = cache.shape
    blocks = block_tables[:, :num_blocks].to(torch.long)
    # index_select on the flat block ids: several times faster on CPU than advanced indexing
    gathered = cache.index_select(0, blocks.reshape(-1))
    return gathered.view(blocks.shape[0], num_blocks * block_size, heads, dim)
