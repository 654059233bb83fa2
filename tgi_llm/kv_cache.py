"""The paged KV cache tensors: allocation, writing new tokens, reading a sequence back.

Layout per layer: K and V each `[num_blocks, block_size, num_kv_heads, head_dim]` (flash-attn's
paged layout), so token slot `s` lives at `[s // block_size, s % block_size]`.

The 8-bit cache (--kv-cache-dtype int8: llama.cpp's q8_0 scheme, in groups of Q8_GROUP) holds int8 codes in
that layout, and right after them in the same memory a float16 scale for every Q8_GROUP elements
(`kv_scales`: `[num_blocks, block_size, num_kv_heads, head_dim / Q8_GROUP]`): an element is its code times
its group's scale. The cache tensor keeps the shape every reader indexes by; the scales travel with its
storage.
"""

from __future__ import annotations

import logging
import math
import platform
from typing import TYPE_CHECKING

import torch

from tgi_llm import hugepages
from tgi_llm.errors import ArgumentValidationError
from tgi_llm.hugepages import HUGE_PAGE

if TYPE_CHECKING:  # models imports the attention backends, which import this module
    from tgi_llm.models.config import ModelConfig

logger = logging.getLogger(__name__)

KVCache = list[tuple[torch.Tensor, torch.Tensor]]

#: --kv-cache-dtype names and the element types of the caches they allocate (int8: the codes, scales beside).
KV_CACHE_TYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                  "int8": torch.int8}
#: Elements per float16 scale in the 8-bit cache. llama.cpp's q8_0 takes 32; 16 keeps 99% top-1 agreement with
#: the float32 cache at 16k tokens too, where 32 fell to 98.8% (docs/PERFORMANCE.md, "Long contexts").
Q8_GROUP = 16

def resolve_kv_cache_dtype(name: str | None, dtype: torch.dtype) -> torch.dtype:
    """The K/V caches' element type for --kv-cache-dtype `name`. None or "auto": `dtype`, the --dtype the
    model runs in, as TGI and vLLM resolve it. On the CPU that keeps the default float32 token-exact with
    transformers, and --dtype bfloat16, which already rounds activations to bfloat16, gets a bfloat16 cache;
    a 16-bit cache under a float32 model is the choice for long contexts (docs/PERFORMANCE.md)."""
    return dtype if name in (None, "auto") else KV_CACHE_TYPES[name]


def _check_kv_cache_dtype_fits(head_dim: int, dtype: torch.dtype) -> None:
    """The int8 cache scales whole groups of Q8_GROUP elements of a head."""
    if dtype == torch.int8 and head_dim % Q8_GROUP:
        raise ArgumentValidationError(
            f"`kv_cache_dtype` int8 scales groups of {Q8_GROUP} elements of a head; this model's head_dim is "
            f"{head_dim}: choose float16 or bfloat16")


def kv_cache_dtype_name(dtype: torch.dtype) -> str:
    """The --kv-cache-dtype name of a cache element type."""
    return next(name for name, t in KV_CACHE_TYPES.items() if t == dtype)


def kv_element_bytes(dtype: torch.dtype) -> float:
    """Bytes a cached element takes (int8: its code and its share of a float16 scale)."""
    return 1 + 2 / Q8_GROUP if dtype == torch.int8 else dtype.itemsize


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
    return [(_cache_tensor(shape, dtype, device), _cache_tensor(shape, dtype, device))
            for _ in range(config.num_hidden_layers)]


def _cache_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """One zeroed K or V cache; int8: its codes, with room for their scales after them."""
    _check_kv_cache_dtype_fits(shape[-1], dtype)
    elements = math.prod(shape)
    nbytes = elements + elements // Q8_GROUP * 2 if dtype == torch.int8 else elements * dtype.itemsize
    if torch.device(device).type == "cpu":
        memory = _zeros_cpu((nbytes,), torch.uint8)
    else:
        memory = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    return memory[: elements * dtype.itemsize].view(dtype).view(shape)


def kv_scales(cache: torch.Tensor) -> torch.Tensor:
    """The float16 scales of an int8 cache (int8 codes from allocate_kv_cache): [..., head_dim / Q8_GROUP], a
    view of the memory after the codes."""
    assert cache.dtype == torch.int8 and cache.is_contiguous()
    first = cache.storage_offset() + cache.numel()  # bytes: the scales follow the codes
    assert first % 2 == 0 and cache.untyped_storage().nbytes() >= first + cache.numel() // Q8_GROUP * 2
    shape = (*cache.shape[:-1], cache.shape[-1] // Q8_GROUP)
    return torch.empty(0, dtype=torch.float16, device=cache.device).set_(cache.untyped_storage(), first // 2, shape)


def cache_memory(cache: torch.Tensor) -> torch.Tensor:
    """All the memory of one cache tensor as bytes (an int8 cache's scales included)."""
    storage = cache.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=cache.device).set_(storage, 0, (storage.nbytes(),))


def quantize_q8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] for the int8 cache: codes [..., D] and float16 scales [..., D / Q8_GROUP]. A group's scale is its
    largest magnitude / 127; codes round to nearest even. The C kernels' kv_store_row computes the same bits."""
    groups = x.float().unflatten(-1, (-1, Q8_GROUP))
    scale = groups.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(scale > 0, 1 / scale, 0.0)
    codes = torch.round(groups * inverse).clamp_(-127, 127).to(torch.int8).flatten(-2)
    return codes, scale.squeeze(-1).to(torch.float16)


def dequantize_q8(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The int8 cache's codes [..., D] and scales [..., D / Q8_GROUP] as values of `dtype`."""
    values = codes.float().unflatten(-1, (-1, Q8_GROUP)) * scales.float().unsqueeze(-1)
    return values.flatten(-2).to(dtype)


def cache_of(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A cache tensor of `dtype` holding x ([num_blocks, block_size, Hkv, D]) rounded to it: for tests and
    self-checks that build a cache from values."""
    return fill_cache(_cache_tensor(tuple(x.shape), dtype, x.device), x)


def fill_cache(cache: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Every slot of `cache` set to `values` (its shape) rounded to the cache's type; returns the cache."""
    slots = torch.arange(cache.shape[0] * cache.shape[1], device=cache.device)
    _store_rows(values.flatten(0, 1), cache, slots)
    return cache


def read_cache(cache: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A whole cache tensor's values in `dtype`."""
    return dequantize_q8(cache, kv_scales(cache), dtype) if cache.dtype == torch.int8 else cache.to(dtype)


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store new tokens' K/V ([T, Hkv, D]) at their slots, rounded to the cache's type (to nearest even)."""
    _store_rows(k, k_cache, slot_mapping)
    _store_rows(v, v_cache, slot_mapping)


def _store_rows(new: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Token rows [T, Hkv, D] into `cache` at `slots`, rounded to its type (int8: codes and their scales)."""
    if cache.dtype == torch.int8:
        codes, scales = quantize_q8(new)
        kv_scales(cache).flatten(0, 1).index_copy_(0, slots, scales)
        cache.flatten(0, 1).index_copy_(0, slots, codes)
    else:
        cache.flatten(0, 1).index_copy_(0, slots, new.to(cache.dtype))


def as_cached(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """x as a read from `cache` gives it back: rounded through the cache's type, in x's type. Attention over
    new tokens' fresh K/V sees what later steps will read of them."""
    if cache.dtype == torch.int8:
        return dequantize_q8(*quantize_q8(x), x.dtype)
    return x if cache.dtype == x.dtype else x.to(cache.dtype).to(x.dtype)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """The first `num_blocks` blocks of each row of `block_tables` ([B, >=num_blocks]) as one
    contiguous run per sequence: [B, num_blocks * block_size, Hkv, D], in `dtype` (None: the cache's; an
    int8 cache's values come as float32)."""
    _, block_size, heads, dim = cache.shape
    blocks = block_tables[:, :num_blocks].to(torch.long)
    # index_select on the flat block ids: several times faster on CPU than advanced indexing
    gathered = cache.index_select(0, blocks.reshape(-1))
    if cache.dtype == torch.int8:
        gathered = dequantize_q8(gathered, kv_scales(cache).index_select(0, blocks.reshape(-1)), dtype or torch.float32)
    elif dtype is not None:
        gathered = gathered.to(dtype)
    return gathered.view(blocks.shape[0], num_blocks * block_size, heads, dim)
