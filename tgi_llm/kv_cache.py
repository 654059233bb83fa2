"""The paged KV cache tensors: allocation, writing new tokens, reading a sequence back.

Layout per layer: K and V each `[num_blocks, block_size, num_kv_heads, head_dim]` (flash-attn's
paged layout), so token slot `s` lives at `[s // block_size, s % block_size]`.
"""

from __future__ import annotations

import logging
import math
import platform
from typing import TYPE_CHECKING

import torch

from tgi_llm import hugepages
from tgi_llm.hugepages import HUGE_PAGE

if TYPE_CHECKING:  # models imports the attention backends, which import this module
    from tgi_llm.models.config import ModelConfig

logger = logging.getLogger(__name__)

KVCache = list[tuple[torch.Tensor, torch.Tensor]]

#: The cache type --kv-cache-dtype auto picks on the CPU, whatever --dtype (the CPU computes K/V in float32
#: even then). The default is chosen from the measurements in docs/PERFORMANCE.md ("Long contexts"):
#: float32 keeps token-exact parity with transformers; 16 bits halve KV memory and long-context decode time.
CPU_AUTO_KV_DTYPE = torch.float32


def resolve_kv_cache_dtype(name: str | None, device: str | torch.device, model_dtype: torch.dtype) -> torch.dtype:
    """The K/V caches' element type for --kv-cache-dtype `name`. None or "auto": on the CPU CPU_AUTO_KV_DTYPE,
    elsewhere `model_dtype`, the dtype the model computes in (flash-attn reads no other)."""
    if name not in (None, "auto"):
        return getattr(torch, name)
    return CPU_AUTO_KV_DTYPE if torch.device(device).type == "cpu" else model_dtype


def _zeros_cpu(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros in fresh anonymous memory (Linux backs it with zero pages on first touch, so the pool costs
    resident memory only as blocks are used: `tgi_llm.memory` reports how much), on 2 MiB pages where
    Linux allows (THP in `madvise` mode, the common default). Attention reads each sequence's blocks
    scattered over the cache, and with 4 KiB pages every block costs TLB misses and stops the hardware
    prefetcher at each page edge; and whoever reads the process's smaps (a memory monitor) walks one page
    table entry per 4 KiB in use, in the kernel, with the process's mappings locked."""
    if math.prod(shape) * dtype.itemsize < 4 * HUGE_PAGE or platform.system() != "Linux":
        return torch.zeros(shape, dtype=dtype)
    return hugepages.zeros(shape, dtype)


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
    if torch.device(device).type == "cpu":
        return [(_zeros_cpu(shape, dtype), _zeros_cpu(shape, dtype)) for _ in range(config.num_hidden_layers)]
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(config.num_hidden_layers)
    ]


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store new tokens' K/V ([T, Hkv, D]) at their slots, rounded to the cache's type (to nearest even)."""
    num_blocks, block_size, heads, dim = k_cache.shape
    flat_k = k_cache.view(num_blocks * block_size, heads, dim)
    flat_v = v_cache.view(num_blocks * block_size, heads, dim)
    flat_k.index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    flat_v.index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def as_cached(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """x as a read from `cache` gives it back: rounded through the cache's type, in x's type. Attention over
    new tokens' fresh K/V sees what later steps will read of them."""
    return x if cache.dtype == x.dtype else x.to(cache.dtype).to(x.dtype)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """The first `num_blocks` blocks of each row of `block_tables` ([B, >=num_blocks]) as one
    contiguous run per sequence: [B, num_blocks * block_size, Hkv, D], in `dtype` (None: the cache's)."""
    _, block_size, heads, dim = cache.shape
    blocks = block_tables[:, :num_blocks].to(torch.long)
    # index_select on the flat block ids: several times faster on CPU than advanced indexing
    gathered = cache.index_select(0, blocks.reshape(-1))
    if dtype is not None:
        gathered = gathered.to(dtype)
    return gathered.view(blocks.shape[0], num_blocks * block_size, heads, dim)
