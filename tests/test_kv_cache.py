"""The KV pool's memory: zeroed, private, on huge pages where the kernel offers them; each cache type's
layout, writes and reads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.test_hugepages import anon_huge_kb, mapping_of, thp_mode
from tgi_llm.errors import ArgumentValidationError
from tgi_llm.hugepages import HUGE_PAGE
from tgi_llm.kv_cache import (
    KV_CACHE_TYPES,
    allocate_kv_cache,
    as_cached,
    cache_memory,
    cache_of,
    gather_kv,
    kv_cache_dtype_name,
    kv_scales,
    quantize_q8,
    read_cache,
    resolve_kv_cache_dtype,
    write_kv_cache,
)

#: 33.5 MB per K or V tensor: large enough for a mapping of its own.
CONFIG = SimpleNamespace(num_key_value_heads=2, head_dim=64, num_hidden_layers=2)


def private(t: torch.Tensor) -> bool:
    lo, _ = mapping_of(t)
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if int(fields[0].split("-")[0], 16) == lo:
                return fields[1].endswith("p")
    raise AssertionError("mapping not found")


def test_a_large_pool_is_zeroed_private_memory_on_huge_page_boundaries():
    k, v = allocate_kv_cache(CONFIG, num_blocks=4096, block_size=16)[0]
    assert k.data_ptr() % HUGE_PAGE == 0 and v.data_ptr() % HUGE_PAGE == 0
    # shared anonymous memory is shmem: THP leaves it in 4 KiB pages whatever the advice ("never" by default)
    assert private(k) and private(v)
    assert not k.any() and not v.any()


@pytest.mark.skipif(thp_mode() != "madvise", reason="needs THP in madvise mode (advice decides)")
def test_written_blocks_lie_in_huge_pages_unless_turned_off(use_settings):
    k, _ = allocate_kv_cache(CONFIG, num_blocks=4096, block_size=16)[0]
    k.view(-1)[: 2 * HUGE_PAGE // 4].fill_(1.0)
    assert anon_huge_kb(*mapping_of(k)) >= HUGE_PAGE // 1024  # (a fragmented machine may back some in 4 KiB)
    use_settings(huge_pages=False)
    plain, _ = allocate_kv_cache(CONFIG, num_blocks=4096, block_size=16)[0]
    plain.view(-1)[: 2 * HUGE_PAGE // 4].fill_(1.0)
    assert anon_huge_kb(*mapping_of(plain)) == 0


def test_kv_cache_dtype_auto_is_the_model_dtype_and_names_are_types():
    assert resolve_kv_cache_dtype(None, torch.float32) == torch.float32
    assert resolve_kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_cache_dtype("float16", torch.float32) == torch.float16
    assert resolve_kv_cache_dtype("bfloat16", torch.float16) == torch.bfloat16
    assert resolve_kv_cache_dtype("float32", torch.bfloat16) == torch.float32
    assert resolve_kv_cache_dtype("int8", torch.float32) == torch.int8
    names = list(KV_CACHE_TYPES)
    assert [kv_cache_dtype_name(resolve_kv_cache_dtype(n, torch.float32)) for n in names] == names


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_cache_of_each_type_stores_rounded_tokens_and_reads_them_back_in_any_type(dtype):
    caches = allocate_kv_cache(SimpleNamespace(num_key_value_heads=2, head_dim=8, num_hidden_layers=1), 4, 4, dtype)
    k_cache, v_cache = caches[0]
    assert k_cache.dtype == v_cache.dtype == dtype and k_cache.shape == (4, 4, 2, 8)
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(6, 2, 8, generator=gen), torch.randn(6, 2, 8, generator=gen)
    slots = torch.tensor([4, 5, 6, 7, 12, 13])  # blocks 1 and 3
    write_kv_cache(k, v, k_cache, v_cache, slots)
    got = gather_kv(k_cache, torch.tensor([[1, 3]]), 2, torch.float32)[0, [0, 1, 2, 3, 4, 5]]
    assert got.dtype == torch.float32
    assert torch.equal(got, as_cached(k, k_cache)) and torch.equal(got, k.to(dtype).float())
    assert torch.equal(gather_kv(v_cache, torch.tensor([[1, 3]]), 2)[0, :6], v.to(dtype))
    assert (as_cached(k, k_cache) is k) == (dtype == torch.float32)  # nothing to round in a float32 cache


def test_an_int8_cache_holds_codes_and_their_scales_and_reads_back_within_half_a_step():
    """int8 codes in the cache's shape, float16 scales (a group of 16's largest magnitude / 127) right after
    them in the same memory; a value reads back within half a code step of its group (and the scale's float16
    rounding, 2^-11 of up to 127 steps)."""
    config = SimpleNamespace(num_key_value_heads=2, head_dim=64, num_hidden_layers=1)
    k_cache, v_cache = allocate_kv_cache(config, 4, 4, torch.int8)[0]
    assert k_cache.dtype == torch.int8 and k_cache.shape == (4, 4, 2, 64)
    scales = kv_scales(k_cache)
    assert scales.dtype == torch.float16 and scales.shape == (4, 4, 2, 4)
    assert scales.data_ptr() == k_cache.data_ptr() + k_cache.numel()
    assert cache_memory(k_cache).numel() == 4 * 4 * 2 * (64 + 8)
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(6, 2, 64, generator=gen) * 3, torch.randn(6, 2, 64, generator=gen)
    k[0, 0, :16] = 0  # an all-zero group: scale 0, codes 0
    slots = torch.tensor([4, 5, 6, 7, 12, 13])
    write_kv_cache(k, v, k_cache, v_cache, slots)
    got = gather_kv(k_cache, torch.tensor([[1, 3]]), 2)[0, :6]
    assert got.dtype == torch.float32 and torch.equal(got, as_cached(k, k_cache))
    step = k.unflatten(-1, (4, 16)).abs().amax(-1, keepdim=True) / 127
    assert ((got - k).unflatten(-1, (4, 16)).abs() <= step * (0.5 + 127 / 2**11)).all()
    assert torch.equal(got[0, 0, :16], torch.zeros(16))
    codes = k_cache.flatten(0, 1)[slots]
    assert codes.abs().amax() == 127 and torch.equal(codes, quantize_q8(k)[0])
    assert torch.equal(kv_scales(k_cache).flatten(0, 1)[slots], quantize_q8(k)[1])
    assert torch.equal(read_cache(cache_of(k.view(6, 1, 2, 64), torch.int8))[:, 0], got)


def test_an_int8_cache_needs_heads_of_whole_groups():
    config = SimpleNamespace(num_key_value_heads=2, head_dim=40, num_hidden_layers=1)
    with pytest.raises(ArgumentValidationError, match="int8 scales groups of 16 .* head_dim is 40"):
        allocate_kv_cache(config, 4, 4, torch.int8)
