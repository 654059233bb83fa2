"""The C paged-decode kernel against the pure-torch decode path and a float64 reference."""

from __future__ import annotations

import pytest
import torch

from tgi_llm.attention.cpu_kernels import PagedDecodeKernel, paged_decode_kernel
from tgi_llm.kv_cache import gather_kv

kernel = paged_decode_kernel()
pytestmark = pytest.mark.skipif(kernel is None, reason="no C compiler: the torch path is used")


def reference(q, k_cache, v_cache, tables, lens, scale):
    """Dense attention in float64, one sequence at a time; query head h reads KV head h // G."""
    out = []
    group = q.shape[1] // k_cache.shape[2]
    for i, n in enumerate(lens):
        blocks = -(-n // k_cache.shape[1])
        k = gather_kv(k_cache, tables[i : i + 1], blocks)[0, :n].double().repeat_interleave(group, dim=1)
        v = gather_kv(v_cache, tables[i : i + 1], blocks)[0, :n].double().repeat_interleave(group, dim=1)
        p = (torch.einsum("hd,khd->hk", q[i].double(), k) * scale).softmax(-1)
        out.append(torch.einsum("hk,khd->hd", p, v))
    return torch.stack(out).float()


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block_size"),
    [(9, 3, 64, 16), (4, 2, 16, 4), (8, 8, 32, 1), (6, 1, 128, 17), (2, 2, 64, 32)],
)
def test_matches_reference_over_ragged_lengths(heads, kv_heads, dim, block_size):
    gen = torch.Generator().manual_seed(0)
    lens = [1, 2, 15, 16, 17, 33, 100, 257]
    width = max(-(-n // block_size) for n in lens) + 1
    num_blocks = len(lens) * width + 3
    # NaN everywhere else: the kernel must never read past a sequence's length
    k_cache = torch.full((num_blocks, block_size, kv_heads, dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    tables = torch.randperm(num_blocks, generator=gen)[: len(lens) * width].view(len(lens), width).to(torch.int32)
    for i, n in enumerate(lens):
        for pos in range(n):
            blk, off = tables[i, pos // block_size], pos % block_size
            k_cache[blk, off] = torch.randn(kv_heads, dim, generator=gen)
            v_cache[blk, off] = torch.randn(kv_heads, dim, generator=gen)
    q = torch.randn(len(lens), heads, dim, generator=gen) * 3
    scale = dim**-0.5
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    got = kernel(q, k_cache, v_cache, tables, seq_lens, max(lens), scale)
    torch.testing.assert_close(got, reference(q, k_cache, v_cache, tables, lens, scale), rtol=1e-5, atol=1e-5)


def test_same_result_for_a_sequence_whatever_the_batch():
    gen = torch.Generator().manual_seed(1)
    k_cache, v_cache = torch.randn(2, 40, 16, 3, 64, generator=gen).unbind(0)
    tables = torch.arange(40, dtype=torch.int32).view(4, 10)
    lens = torch.tensor([150, 20, 77, 160], dtype=torch.int32)
    q = torch.randn(4, 9, 64, generator=gen)
    together = kernel(q, k_cache, v_cache, tables, lens, 160, 0.125)
    for i in range(4):
        alone = kernel(q[i : i + 1], k_cache, v_cache, tables[i : i + 1], lens[i : i + 1], int(lens[i]), 0.125)
        assert torch.equal(alone[0], together[i])


def test_supports_only_what_it_computes():
    cache = torch.zeros(4, 16, 2, 64)
    assert PagedDecodeKernel.supports(torch.zeros(3, 4, 64), cache)
    assert not PagedDecodeKernel.supports(torch.zeros(3, 4, 64, dtype=torch.bfloat16), cache)
    assert not PagedDecodeKernel.supports(torch.zeros(3, 4, 8), torch.zeros(4, 16, 2, 8))  # D % 16
    assert not PagedDecodeKernel.supports(torch.zeros(3, 4, 64), cache.transpose(1, 2))
