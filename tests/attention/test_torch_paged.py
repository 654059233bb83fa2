"""The torch paged-attention backend against a dense reference over each sequence's full history."""

from __future__ import annotations

import math

import pytest
import torch

import tgi_llm.attention as attention_pkg
from tgi_llm.attention import TorchPagedAttention, preferred_block_size, select_attention_backend
from tgi_llm.attention.cpu_kernels import cpu_attention_kernels
from tgi_llm.kv_cache import as_cached, cache_of, read_cache

HQ, HKV, D = 4, 2, 8


def reference(q: torch.Tensor, k_hist: torch.Tensor, v_hist: torch.Tensor, scale: float) -> torch.Tensor:
    """Dense causal attention in float64 for one sequence's last `len(q)` tokens; GQA as in
    transformers: query head h reads KV head h // (HQ // HKV)."""
    q_len, ctx = q.shape[0], k_hist.shape[0]
    k = k_hist.double().repeat_interleave(HQ // HKV, dim=1)
    v = v_hist.double().repeat_interleave(HQ // HKV, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    allowed = torch.arange(ctx)[None, :] <= (torch.arange(q_len)[:, None] + ctx - q_len)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).float()


def run_steps(paged_batcher, steps: list[list[tuple[int, int]]], block_size: int, dim: int = D,
              kv_dtype: torch.dtype = torch.float32) -> None:
    """Each step: (sequence id, number of new tokens). Checks output and cache contents every step: with a
    16- or 8-bit cache, attention is exactly attention over the K/V history rounded to it, prompt tokens
    included."""
    gen = torch.Generator().manual_seed(0)
    batcher = paged_batcher(block_size=block_size, num_blocks=64)
    k_cache, v_cache = (cache_of(torch.zeros(64, block_size, HKV, dim), kv_dtype) for _ in range(2))
    history: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    backend = TorchPagedAttention()
    scale = 1 / math.sqrt(dim)
    for step in steps:
        _, _, attn = batcher.step([(sid, [0] * n) for sid, n in step])
        total = sum(n for _, n in step)
        q, k, v = (torch.randn(total, h, dim, generator=gen) for h in (HQ, HKV, HKV))
        out = backend.forward(q, k, v, k_cache, v_cache, attn, scale)
        assert out.shape == q.shape
        start = 0
        for sid, n in step:
            old_k, old_v = history.get(sid, (torch.empty(0, HKV, dim), torch.empty(0, HKV, dim)))
            k_hist = torch.cat([old_k, as_cached(k[start : start + n], k_cache)])
            v_hist = torch.cat([old_v, as_cached(v[start : start + n], v_cache)])
            history[sid] = (k_hist, v_hist)
            expected = reference(q[start : start + n], k_hist, v_hist, scale)
            torch.testing.assert_close(out[start : start + n], expected, rtol=1e-5, atol=1e-5)
            # the cache holds the whole history at the sequence's slots
            table = batcher.tables[sid]
            pos = torch.arange(k_hist.shape[0])
            blocks = torch.tensor(table)[pos // block_size]
            assert torch.equal(read_cache(k_cache)[blocks, pos % block_size], k_hist)
            assert torch.equal(read_cache(v_cache)[blocks, pos % block_size], v_hist)
            start += n


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8])
def test_mixed_prefill_chunked_prefill_and_decode(paged_batcher, kv_dtype):
    steps = [
        [(0, 7), (1, 1), (2, 12)],  # prefills, one of a single token
        [(0, 1), (1, 5), (2, 1)],  # decode, chunked prefill over a cached prefix, decode
        [(3, 9), (0, 1), (1, 1), (2, 3)],  # new prefill next to decodes and a chunk
        [(0, 1), (1, 1), (2, 1), (3, 1)],  # pure decode: the batched path
    ]
    run_steps(paged_batcher, steps, block_size=4, kv_dtype=kv_dtype, dim=16 if kv_dtype == torch.int8 else D)


@pytest.mark.parametrize("prefill_kernel", [True, False])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8])
def test_prompt_chunks_by_the_c_kernel_or_sdpa_agree(paged_batcher, monkeypatch, c_kernels, prefill_kernel,
                                                     kv_dtype):
    """Head size 16, which the C kernels take: decodes through the decode kernel, prompt chunks through
    whichever prefill was chosen at load (cpu_kernels._choose_prefill), from each cache type."""
    kernels = cpu_attention_kernels()
    monkeypatch.setattr(kernels, "prefill_wins", prefill_kernel)
    steps = [[(0, 7), (1, 1), (2, 12)], [(0, 1), (1, 5), (2, 1)], [(3, 9), (0, 1), (1, 1), (2, 3)]]
    run_steps(paged_batcher, steps, block_size=4, dim=16, kv_dtype=kv_dtype)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("window", "softcap"), [(5, None), (None, 20.0), (5, 20.0)])
def test_window_and_softcap_read_a_16_bit_cache_as_a_float32_cache_of_its_rounded_k_v(paged_batcher, kv_dtype,
                                                                                      window, softcap):
    """The per-sequence path (windowed_attention; head size 8, which the C kernels do not take): exactly the
    float32 cache's attention over K/V rounded to the 16-bit type, and near the float32 cache's over the same
    K/V (16-bit rounding: bfloat16 keeps 8 significant bits, float16 11)."""
    gen = torch.Generator().manual_seed(0)
    batcher = paged_batcher(block_size=4, num_blocks=16)
    sixteen, rounded, exact = ((torch.zeros(16, 4, HKV, D, dtype=t), torch.zeros(16, 4, HKV, D, dtype=t))
                               for t in (kv_dtype, torch.float32, torch.float32))
    backend, scale = TorchPagedAttention(), 1 / math.sqrt(D)
    tolerance = 2e-2 if kv_dtype == torch.bfloat16 else 3e-3
    for step in ([(0, 7), (1, 12)], [(0, 1), (1, 1)], [(0, 3), (1, 1)]):  # prompts, decodes, a chunk and a decode
        _, _, attn = batcher.step([(sid, [0] * n) for sid, n in step])
        total = sum(n for _, n in step)
        q, k, v = (torch.randn(total, h, D, generator=gen) for h in (HQ, HKV, HKV))
        got = backend.forward(q, k, v, *sixteen, attn, scale, window, softcap)
        as_stored = backend.forward(q, k.to(kv_dtype).float(), v.to(kv_dtype).float(), *rounded, attn, scale,
                                    window, softcap)
        unrounded = backend.forward(q, k, v, *exact, attn, scale, window, softcap)
        assert torch.equal(got, as_stored)
        torch.testing.assert_close(got, unrounded, rtol=tolerance, atol=tolerance)
        assert not torch.equal(got, unrounded)  # the cache did round


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_block_sizes(paged_batcher, block_size):
    steps = [[(0, 5), (1, 2)], [(0, 1), (1, 1)], [(0, 1), (1, 6)], [(0, 1), (1, 1)]]
    run_steps(paged_batcher, steps, block_size=block_size)


def test_long_decode_batch_with_ragged_lengths(paged_batcher):
    lengths = [1, 2, 3, 8, 17, 30]
    steps = [[(i, n) for i, n in enumerate(lengths)]] + [[(i, 1) for i in range(len(lengths))]] * 3
    run_steps(paged_batcher, steps, block_size=4)


def test_selects_torch_on_cpu(caplog):
    with caplog.at_level("INFO", logger="tgi_llm.attention"):
        backend = select_attention_backend("cpu", block_size=16)
    assert isinstance(backend, TorchPagedAttention)
    assert "torch" in caplog.text
    assert preferred_block_size("cpu", default=16) == 16


def test_selection_rejects_block_size_flash_cannot_use(monkeypatch):
    monkeypatch.setattr(attention_pkg, "flash_attn_available", lambda: True)
    with pytest.raises(ValueError, match="multiple of 256"):
        select_attention_backend("cuda", block_size=16)
    # the torch backend can still be asked for explicitly
    assert isinstance(select_attention_backend("cuda", block_size=16, name="torch"), TorchPagedAttention)


def test_selection_errors_name_the_problem(monkeypatch):
    with pytest.raises(ValueError, match="CUDA"):
        select_attention_backend("cpu", block_size=256, name="flash-attn")
    with pytest.raises(ValueError, match="unknown attention backend"):
        select_attention_backend("cpu", block_size=16, name="xformers")
    monkeypatch.setattr(attention_pkg, "flash_attn_available", lambda: False)
    assert isinstance(select_attention_backend("cuda", block_size=16), TorchPagedAttention)
    with pytest.raises(ValueError, match="flash_attn package"):
        select_attention_backend("cuda", block_size=256, name="flash-attn")
