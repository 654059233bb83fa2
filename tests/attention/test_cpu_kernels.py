"""The C attention kernels (paged decode, prefill) against a float64 reference."""

from __future__ import annotations

import pytest
import torch

from tests.native.builds import build_variant, patched_sources
from tgi_llm.attention import cpu_kernels
from tgi_llm.attention.cpu_kernels import (
    KV_DTYPES,
    CpuAttentionKernels,
    PrefillSequence,
    _choose_prefill,
    cpu_attention_kernels,
)
from tgi_llm.kv_cache import cache_of, gather_kv, read_cache

kernel = cpu_attention_kernels()
pytestmark = pytest.mark.usefixtures("c_kernels")  # fails, never skips, without a compiler
needs_bf16 = pytest.mark.skipif(kernel is None or kernel.bf16_prefill_address is None,
                                reason="the CPU has no AVX512-BF16: bfloat16 prompt attention stays float32")


def reference(q, k_cache, v_cache, tables, lens, scale, softcap=None):
    """Dense attention in float64, one sequence at a time; query head h reads KV head h // G."""
    out = []
    group = q.shape[1] // k_cache.shape[2]
    for i, n in enumerate(lens):
        blocks = -(-n // k_cache.shape[1])
        k = gather_kv(k_cache, tables[i : i + 1], blocks)[0, :n].double().repeat_interleave(group, dim=1)
        v = gather_kv(v_cache, tables[i : i + 1], blocks)[0, :n].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,khd->hk", q[i].double(), k) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        p = scores.softmax(-1)
        out.append(torch.einsum("hk,khd->hd", p, v))
    return torch.stack(out).float()


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block_size"),
    [(9, 3, 64, 16), (4, 2, 16, 4), (8, 8, 32, 1), (6, 1, 128, 17), (2, 2, 64, 32)],
)
@pytest.mark.parametrize("softcap", [None, 1.5])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_matches_reference_over_ragged_lengths(heads, kv_heads, dim, block_size, softcap, kv_dtype):
    """Soft-capped too (Gemma 2: scores -> cap tanh(scores / cap)), with scores far past the cap both ways;
    from each cache type (the reference reads the same 16- or 8-bit values, exactly widened)."""
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
    k_cache, v_cache = cache_of(k_cache, kv_dtype), cache_of(v_cache, kv_dtype)
    got = kernel.decode(q, k_cache, v_cache, tables, seq_lens, max(lens), scale, softcap)
    want = reference(q, k_cache, v_cache, tables, lens, scale, softcap)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_same_result_for_a_sequence_whatever_the_batch(threads):
    """Alone, a sequence is one work item per KV head; in a batch of 8, one item for all its heads (from 4
    sequences a thread): both give the same bits."""
    gen = torch.Generator().manual_seed(1)
    k_cache, v_cache = torch.randn(2, 80, 16, 3, 64, generator=gen).unbind(0)
    tables = torch.randperm(80, generator=gen).to(torch.int32).view(8, 10)
    lens = torch.tensor([150, 20, 77, 160, 1, 16, 131, 3], dtype=torch.int32)
    q = torch.randn(8, 9, 64, generator=gen)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together = kernel.decode(q, k_cache, v_cache, tables, lens, 160, 0.125)
        for i in range(8):
            one = slice(i, i + 1)
            alone = kernel.decode(q[one], k_cache, v_cache, tables[one], lens[one], int(lens[i]), 0.125)
            assert torch.equal(alone[0], together[i])
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("lens", [[2000], [700, 130], [1, 5000], [256, 300, 129]])
def test_a_long_context_split_over_the_threads_matches_reference(kv_dtype, lens):
    """Few sequences with long contexts split each KV head's keys into parts (flash-decoding), combined
    after: the same attention, at 1 thread (fewer parts) and 2, including a part past a short sequence's end."""
    gen = torch.Generator().manual_seed(len(lens))
    block_size, width = 16, -(-max(lens) // 16)
    k_cache, v_cache = (cache_of(torch.randn(len(lens) * width, block_size, 3, 64, generator=gen), kv_dtype)
                        for _ in range(2))
    tables = torch.randperm(len(lens) * width, generator=gen).to(torch.int32).view(len(lens), width)
    q = torch.randn(len(lens), 9, 64, generator=gen) * 3
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    want = reference(q, k_cache, v_cache, tables, lens, 0.125)
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = kernel.decode(q, k_cache, v_cache, tables, seq_lens, max(lens), 0.125)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float16, torch.int8])
def test_prefill_over_a_16_or_8_bit_cache_matches_reference(kv_dtype):
    """Prompt chunks after cached tokens, two sequences in one call, read from a 16-bit or int8 cache:
    attention over exactly those values."""
    gen = torch.Generator().manual_seed(5)
    contexts = [tuple(read_cache(cache_of(torch.randn(n, 3, 64, generator=gen), kv_dtype)) for _ in range(2))
                for n in (90, 37)]
    k_cache, v_cache, tables = paged(contexts, 3, 64, 16, gen)
    q = torch.randn(30 + 37, 9, 64, generator=gen)
    out = torch.full_like(q, float("nan"))
    kernel.prefill(q, out, cache_of(k_cache, kv_dtype), cache_of(v_cache, kv_dtype), tables,
                   [PrefillSequence(0, 30, 90, 0), PrefillSequence(30, 37, 37, 1)], 0.125)
    torch.testing.assert_close(out[:30], causal_reference(q[:30], *contexts[0], 0.125), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[30:], causal_reference(q[30:], *contexts[1], 0.125), rtol=1e-5, atol=1e-5)


def test_supports_only_what_it_computes():
    cache = torch.zeros(4, 16, 2, 64)
    assert CpuAttentionKernels.supports(torch.zeros(3, 4, 64), cache)
    assert not CpuAttentionKernels.supports(torch.zeros(3, 4, 64, dtype=torch.bfloat16), cache)
    for dtype in (torch.bfloat16, torch.float16):  # 16-bit caches, converted as read
        assert CpuAttentionKernels.supports(torch.zeros(3, 4, 64), cache.to(dtype))
    assert CpuAttentionKernels.supports(torch.zeros(3, 4, 64), cache_of(cache, torch.int8))
    assert not CpuAttentionKernels.supports(torch.zeros(3, 4, 64), cache.to(torch.int16))
    assert not CpuAttentionKernels.supports(torch.zeros(3, 4, 8), torch.zeros(4, 16, 2, 8))  # D % 16
    assert not CpuAttentionKernels.supports(torch.zeros(3, 4, 512), torch.zeros(4, 16, 2, 512))  # D > 256


def causal_reference(q, k, v, scale):
    """One sequence, float64, query head h reads KV head h // G; the n queries are the last n of the
    context's positions."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, dim=1), v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    n, context = q.shape[0], k.shape[0]
    scores = scores.masked_fill(torch.ones(n, context, dtype=torch.bool).triu(context - n + 1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).float()


def paged(contexts, kv_heads, dim, block_size, gen):
    """Each context's K/V ([L, Hkv, D] pairs) scattered over a shuffled paged cache whose other slots are
    NaN (the kernel must read nothing else); returns the caches and the block tables."""
    width = max(-(-k.shape[0] // block_size) for k, _ in contexts)
    num_blocks = len(contexts) * width + 2
    k_cache = torch.full((num_blocks, block_size, kv_heads, dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    tables = torch.randperm(num_blocks, generator=gen)[: len(contexts) * width].view(len(contexts), width)
    for i, (k, v) in enumerate(contexts):
        for pos in range(k.shape[0]):
            blk, off = tables[i, pos // block_size], pos % block_size
            k_cache[blk, off], v_cache[blk, off] = k[pos], v[pos]
    return k_cache, v_cache, tables.to(torch.int32)


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size"),
                         [(9, 3, 64, 16), (4, 2, 16, 4), (8, 8, 32, 1), (6, 1, 128, 17), (48, 1, 32, 16)])
def test_prefill_matches_reference(heads, kv_heads, dim, block_size):
    gen = torch.Generator().manual_seed(2)
    lens = [2, 15, 16, 17, 40, 129]
    total = sum(lens)
    # q as a view of one fused projection, the way the model hands it over (strided rows)
    q = torch.randn(total, (heads + 2 * kv_heads) * dim, generator=gen).view(total, -1, dim)[:, :heads] * 2
    contexts = [(torch.randn(n, kv_heads, dim, generator=gen), torch.randn(n, kv_heads, dim, generator=gen))
                for n in lens]
    k_cache, v_cache, tables = paged(contexts, kv_heads, dim, block_size, gen)
    out = torch.full((total, heads, dim), float("nan"))
    starts = [sum(lens[:i]) for i in range(len(lens))]
    kernel.prefill(q, out, k_cache, v_cache, tables, [PrefillSequence(s, n, n, i) for i, (s, n) in
                                                      enumerate(zip(starts, lens, strict=True))], dim**-0.5)
    for (start, n), (k, v) in zip(zip(starts, lens, strict=True), contexts, strict=True):
        rows = slice(start, start + n)
        torch.testing.assert_close(out[rows], causal_reference(q[rows], k, v, dim**-0.5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("cached", "new"), [(16, 16), (1, 40), (100, 3), (37, 29), (0, 5), (500, 70)])
def test_prefill_of_a_chunk_after_cached_tokens_matches_reference(cached, new):
    gen = torch.Generator().manual_seed(cached * 100 + new)
    q = torch.randn(new + 2, 9, 64, generator=gen)  # two extra rows the call must leave alone
    k, v = (torch.randn(cached + new, 3, 64, generator=gen) for _ in range(2))
    k_cache, v_cache, tables = paged([(k, v)], 3, 64, 16, gen)
    out = torch.full_like(q, float("nan"))
    kernel.prefill(q, out, k_cache, v_cache, tables, [PrefillSequence(1, new, cached + new, 0)], 0.125)
    torch.testing.assert_close(out[1 : 1 + new], causal_reference(q[1 : 1 + new], k, v, 0.125), rtol=1e-5, atol=1e-5)
    assert out[0].isnan().all() and out[-1].isnan().all()



def test_prefill_follows_scores_that_climb_far_past_the_running_max():
    """Keys drift along one direction: rows facing it see scores rise by ~150 over the context, more than
    float32's exp can span, so their running max must move again and again past the kernel's lazy-rescale
    margin; rows facing away see them fall. Both kinds share the kernel's vectors."""
    gen = torch.Generator().manual_seed(7)
    n, dim = 300, 64
    direction = torch.nn.functional.normalize(torch.randn(dim, generator=gen), dim=0)
    k = torch.randn(n, 3, dim, generator=gen) + torch.linspace(0, 150, n)[:, None, None] * direction
    v = torch.randn(n, 3, dim, generator=gen)
    signs = torch.where(torch.rand(n, 9, 1, generator=gen) < 0.5, -1.0, 1.0)
    q = (torch.randn(n, 9, dim, generator=gen) + 8 * direction) * signs
    k_cache, v_cache, tables = paged([(k, v)], 3, dim, 16, gen)
    out = torch.full_like(q, float("nan"))
    kernel.prefill(q, out, k_cache, v_cache, tables, [PrefillSequence(0, n, n, 0)], 0.125)
    # scores near 150 carry float32 rounding of ~1e-5 into every exp: looser than the tests above
    torch.testing.assert_close(out, causal_reference(q, k, v, 0.125), rtol=1e-3, atol=2e-4)

def test_chunks_of_a_prompt_give_the_rows_of_the_whole_prompt():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(90, h, 64, generator=gen) for h in (9, 3, 3))
    k_cache, v_cache, tables = paged([(k, v)], 3, 64, 16, gen)
    whole = torch.empty_like(q)
    kernel.prefill(q, whole, k_cache, v_cache, tables, [PrefillSequence(0, 90, 90, 0)], 0.125)
    chunked = torch.empty_like(q)
    for start, end in ((0, 16), (16, 64), (64, 90)):
        kernel.prefill(q[start:end], chunked[start:end], k_cache, v_cache, tables,
                       [PrefillSequence(0, end - start, end, 0)], 0.125)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("products", ["float32", pytest.param("bfloat16", marks=needs_bf16)])
def test_prefill_of_a_sequence_is_the_same_alone_or_with_others(products):
    """The second sequence's 70 prompt tokens follow 20 cached ones: its rows, and in bfloat16 its K/V
    rounded once per call, do not depend on the first sequence."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(100, 9, 64, generator=gen)
    contexts = [tuple(torch.randn(n, 3, 64, generator=gen) for _ in range(2)) for n in (30, 90)]
    k_cache, v_cache, tables = paged(contexts, 3, 64, 16, gen)
    together = torch.empty(100, 9, 64)
    both = [PrefillSequence(0, 30, 30, 0), PrefillSequence(30, 70, 90, 1)]
    kernel.prefill(q, together, k_cache, v_cache, tables, both, 0.125, bf16=products == "bfloat16")
    alone = torch.empty(70, 9, 64)
    kernel.prefill(q[30:], alone, k_cache, v_cache, tables[1:], [PrefillSequence(0, 70, 90, 0)], 0.125,
                   bf16=products == "bfloat16")
    assert torch.equal(alone, together[30:])


def bf16(x):
    return x.bfloat16().float()


@needs_bf16
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size"),
                         [(9, 3, 64, 16), (4, 2, 16, 4), (6, 1, 128, 17), (48, 1, 32, 16), (4, 2, 80, 16)])
def test_bf16_prefill_is_attention_over_bf16_operands(heads, kv_heads, dim, block_size):
    """Ragged prompts after cached tokens (odd lengths leave half a key pair; head size 80 is not a whole
    number of 4-vector blocks), against float64 attention whose scaled queries, keys and values were rounded
    to bfloat16 first: what is left is the kernel's bfloat16 rounding of the softmax weights (< 1e-2 here),
    where a mistaken pairing of keys, dims or heads is off by the values' own size."""
    gen = torch.Generator().manual_seed(5)
    cached, new = [0, 3, 16, 0, 40, 7], [2, 15, 16, 17, 40, 129]
    total = sum(new)
    q = torch.randn(total, (heads + 2 * kv_heads) * dim, generator=gen).view(total, -1, dim)[:, :heads] * 2
    contexts = [tuple(torch.randn(c + n, kv_heads, dim, generator=gen) for _ in range(2))
                for c, n in zip(cached, new, strict=True)]
    k_cache, v_cache, tables = paged(contexts, kv_heads, dim, block_size, gen)
    out = torch.full((total, heads, dim), float("nan"))
    starts = [sum(new[:i]) for i in range(len(new))]
    kernel.prefill(q, out, k_cache, v_cache, tables, [PrefillSequence(s, n, c + n, i) for i, (s, n, c) in
                                                      enumerate(zip(starts, new, cached, strict=True))],
                   dim**-0.5, bf16=True)
    for start, n, (k, v) in zip(starts, new, contexts, strict=True):
        rows = slice(start, start + n)
        want = causal_reference(bf16(q[rows] * dim**-0.5), bf16(k), bf16(v), 1.0)
        torch.testing.assert_close(out[rows], want, rtol=0, atol=1e-2)
        assert (out[rows] - causal_reference(q[rows], k, v, dim**-0.5)).abs().max() > 1e-5  # it did round


@pytest.mark.skipif(kernel is None or not kernel.amx, reason="no AMX-BF16 tiles on this CPU")
def test_bf16_prefill_on_amx_tiles_matches_the_avx512_bf16_kernel():
    """Where AMX serves the bfloat16 prefill: 300 new tokens after 40 cached (ten 32-key blocks, a partial
    last one, maxima that move) give bfloat16 attention as accurate as the AVX512-BF16 kernel's (the two
    round the softmax weights under different running maxima, so they differ by that rounding), and
    TGI_LLM_AMX's switch (set_amx_prefill) really selects the other kernel."""
    gen = torch.Generator().manual_seed(9)
    heads, kv_heads, dim = 9, 3, 64
    k, v = (torch.randn(340, kv_heads, dim, generator=gen) for _ in range(2))
    q = torch.randn(300, heads, dim, generator=gen) * 2
    k_cache, v_cache, tables = paged([(k, v)], kv_heads, dim, 16, gen)
    want = causal_reference(bf16(q * 0.125), bf16(k), bf16(v), 1.0)
    errors = []
    for on in (1, 0):
        kernel._lib.set_amx_prefill(on)
        out = torch.empty_like(q)
        kernel.prefill(q, out, k_cache, v_cache, tables, [PrefillSequence(0, 300, 340, 0)], 0.125, bf16=True)
        errors.append((out - want).abs().max().item())
    kernel._lib.set_amx_prefill(1)
    assert errors[0] < 1e-2 and errors[1] < 1e-2
    assert errors[0] != errors[1]  # two kernels
    assert errors[0] < 2 * errors[1]


def test_bf16_prefill_is_refused_where_the_cpu_lacks_it(monkeypatch):
    monkeypatch.setattr(kernel, "bf16_prefill_address", None)
    q = torch.zeros(2, 2, 16)
    cache = torch.zeros(1, 4, 1, 16)
    with pytest.raises(ValueError, match="AVX512-BF16"):
        kernel.prefill(q, torch.empty_like(q), cache, cache, torch.zeros(1, 1, dtype=torch.int32),
                       [PrefillSequence(0, 2, 2, 0)], 0.25, bf16=True)


def test_prefill_takes_only_groups_its_work_items_hold():
    cache = torch.zeros(4, 16, 1, 64)
    assert CpuAttentionKernels.supports_prefill(torch.zeros(3, 48, 64), cache)
    assert not CpuAttentionKernels.supports_prefill(torch.zeros(3, 64, 64), cache)  # 64 query heads per KV head
    assert CpuAttentionKernels.supports(torch.zeros(3, 64, 64), cache)  # decode still takes them


@pytest.mark.parametrize("forced", ["kernel", "torch"])
def test_the_prefill_path_can_be_forced(use_settings, forced):
    lib = CpuAttentionKernels(kernel._lib)
    use_settings(cpu_prefill=forced)
    assert "forced" in _choose_prefill(lib)
    assert lib.prefill_wins == (forced == "kernel")


def test_the_prefill_path_is_chosen_by_timing_both(monkeypatch, use_settings):
    lib = CpuAttentionKernels(kernel._lib)
    use_settings(cpu_prefill="auto")
    calls = []
    monkeypatch.setattr(lib, "prefill", lambda *a: calls.append("kernel"))
    monkeypatch.setattr(cpu_kernels, "_sdpa_prefill", lambda *a: calls.append("sdpa"))
    why = _choose_prefill(lib)
    assert why.startswith("measured: kernel") and "SDPA" in why
    assert calls.count("kernel") == calls.count("sdpa") == 3  # a warm-up and two timed runs each


def test_self_check_rejects_a_library_whose_batched_decode_is_wrong(tmp_path, use_settings):
    """The load-time check covers the sequence-per-item path too (batches of 4 sequences a thread): a
    library whose batched decode reads the wrong value head must not serve."""
    use_settings(kernel_cache=tmp_path)
    right = "kv_at(vb, h * D, kind), q8 ? vsb + h * hs : NULL"
    wrong = right.replace("h * D", "0")  # the same value head for every KV head
    broken = build_variant("kernels_wrong_value_head", patched_sources(tmp_path, "attention/paged.c", right, wrong))
    with pytest.raises(RuntimeError, match="paged decode kernel disagrees"):
        cpu_kernels._self_check(CpuAttentionKernels(broken))


@needs_bf16
def test_self_check_rejects_a_library_whose_bf16_prefill_is_wrong(tmp_path, use_settings):
    """A bfloat16 prefill that reads KV head 0's keys for every head must not serve either."""
    use_settings(kernel_cache=tmp_path)
    right = "bf16_row(key_row(kc, table, j0 + t, BS, tok) + h * D, 1.f, D, kb + t * D)"
    root = patched_sources(tmp_path, "attention/paged.c", right, right.replace(" + h * D", ""))
    broken = CpuAttentionKernels(build_variant("kernels_wrong_bf16_keys", root))
    with pytest.raises(RuntimeError, match=r"prefill attention kernel \(bfloat16\) disagrees"):
        cpu_kernels._self_check(broken)
