"""Attention for the CPU as two small C kernels, compiled with the system compiler while the model loads.

Decode: the pure-torch path gathers every sequence's K/V blocks into a padded copy for each layer
(index_select), then runs SDPA over it. That copy moves three times the bytes attention needs, and SDPA's
CPU kernel is slow for one query per sequence; together they cost more than all the model's matmuls at
batch 32. `paged_decode` reads K/V in place through the block table, one sequence per OpenMP work
item (a long context split over the threads where there are few): ~4x faster. Prefill: `paged_prefill_f32`
attends every prompt chunk of the step in one call, reading each chunk's whole context (cached and new
tokens) in place through its block table: no gathered copy, no mask tensor, and a chunk after cached tokens
costs what the same rows of a whole prompt cost.
Both are in tgi_llm/csrc/attention/paged.c, on the native-width vectors of csrc/include/vectors.h. The cache
may hold bfloat16, float16 or int8 codes with their scales (--kv-cache-dtype): decode converts each element in
registers as it reads it; prefill converts the blocks a call reads to float32 first (`paged_prefill_kv`).
`paged_prefill_bf16`, built only where the CPU has AVX512-BF16, is the prefill kernel with bfloat16 products,
for models whose linears run in bfloat16 (`--dtype bfloat16`). docs/CPU_KERNELS.md describes them.

Which prefill is faster can differ by machine (SDPA's flash kernel runs its small GEMMs through MKL, which
takes no AVX-512 path on AMD CPUs, and is good on AVX2). So the prefill path is measured once at load,
kernel against SDPA on one prompt-sized shape, and the faster serves (`TGI_LLM_CPU_PREFILL=kernel|torch`
forces one); decode keeps the kernel, which wins on both (3-4x at batch 8-32 on the Zen 3).

Plain C called through ctypes (no torch headers). It links `libgomp.so.1`,
which the loader resolves to the copy torch already loaded, so it shares torch's thread pool. Built and
cached by `tgi_llm.native` (keyed by the sources, compiler, flags and CPU). The kernels are optional:
without a working compiler, or if they fail their self-check, every caller uses the torch path.
"""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass

import torch

from tgi_llm.kv_cache import cache_of, kv_scales, read_cache
from tgi_llm.native import CheckedKernels
from tgi_llm.native.abi import KvDtype
from tgi_llm.settings import settings

logger = logging.getLogger(__name__)

#: The decode kernel keeps 16 partial vectors per query head on the stack.
_MAX_QUERY_HEADS = 256
#: Query heads per KV head the prefill kernel's work items hold (MAXQ in the C source).
MAX_PREFILL_GROUP = 48
#: The K/V cache element types the kernels read (converted to float32 in registers; --kv-cache-dtype).
KV_DTYPES = {torch.float32: KvDtype.KV_F32, torch.bfloat16: KvDtype.KV_BF16, torch.float16: KvDtype.KV_F16,
             torch.int8: KvDtype.KV_Q8}


def scales_address(cache: torch.Tensor) -> int:
    """Where an int8 cache's scales lie (0 for the other types, whose kernels take none)."""
    return kv_scales(cache).data_ptr() if cache.dtype == torch.int8 else 0


def _rows_ok(x: torch.Tensor) -> bool:
    """[T, H, D] with each row's heads back to back (any row stride): views of the fused qkv output."""
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


class CpuAttentionKernels:
    """The attention kernels of a loaded kernels library (tgi_llm.native)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._decode = lib.paged_decode
        self._prefill_kv = lib.paged_prefill_kv
        #: `paged_prefill_f32`'s address, for the fused layer stack (prompts_t.run) and paged_prefill_kv
        self.prefill_address = ctypes.cast(lib.paged_prefill_f32, ctypes.c_void_p).value
        #: The same with bfloat16 products, where the CPU has AVX512-BF16 (None elsewhere): same arguments.
        self.bf16_prefill_address: int | None = None
        #: Whether bfloat16 prefill runs on AMX tiles (the CPU has them, TGI_LLM_AMX is not 0).
        self.amx = bool(lib.has_amx_prefill()) and settings().amx
        lib.set_amx_prefill(int(self.amx))
        if lib.has_bf16_prefill():
            bf16 = lib.paged_prefill_amx if self.amx else lib.paged_prefill_bf16
            self.bf16_prefill_address = ctypes.cast(bf16, ctypes.c_void_p).value
        self._lib = lib
        #: Prompt chunks through the prefill kernel (True) or SDPA (False): measured at load (_choose_prefill).
        self.prefill_wins = True

    @staticmethod
    def supports(q: torch.Tensor, k: torch.Tensor) -> bool:
        """q [T, Hq, D] float32; k: the cache ([blocks, block_size, Hkv, D], decode; float32, 16-bit or int8)
        or the new keys ([T, Hkv, D])."""
        dim = q.shape[-1]
        return (
            q.device.type == "cpu"
            and q.dtype == torch.float32
            and k.dtype in KV_DTYPES
            and dim % 16 == 0
            and dim <= 256
            and q.shape[1] <= _MAX_QUERY_HEADS
        )

    def decode(
        self,
        q: torch.Tensor,  # [B, Hq, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], contiguous
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [B, >= blocks needed] int32
        seq_lens: torch.Tensor,  # [B] int32
        max_seq_len: int,
        scale: float,
        softcap: float | None = None,  # scores -> softcap * tanh(scores / softcap)
    ) -> torch.Tensor:
        batch, heads, dim = q.shape
        _, block_size, kv_heads, _ = k_cache.shape
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and v_cache.shape == k_cache.shape
        q = q.contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        lens = seq_lens.to(torch.int32).contiguous()
        out = torch.empty_like(q)
        stride = -(-max_seq_len // 16) * 16
        scores = torch.empty((batch, heads, stride), dtype=torch.float32)
        failed = self._decode(
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), scales_address(k_cache), scales_address(v_cache),
            KV_DTYPES[k_cache.dtype], tables.data_ptr(),
            lens.data_ptr(), out.data_ptr(), scores.data_ptr(), batch, heads, kv_heads, dim, block_size,
            tables.shape[1], stride, scale, softcap or 0.0, torch.get_num_threads(),
        )
        if failed:
            raise MemoryError("decode attention kernel: no memory for its split parts")
        return out

    @staticmethod
    def supports_prefill(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        """The prefill kernel's work items hold at most MAX_PREFILL_GROUP query heads per KV head."""
        return CpuAttentionKernels.supports(q, k_cache) and q.shape[1] // k_cache.shape[-2] <= MAX_PREFILL_GROUP

    def prefill(
        self,
        q: torch.Tensor,  # [T, Hq, D] (rows may be strided)
        out: torch.Tensor,  # [T, Hq, D] contiguous; the sequences' rows are written
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], contiguous, the new tokens' K/V written
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [B, W] int32
        sequences: list[PrefillSequence],
        scale: float,
        bf16: bool = False,
    ) -> None:
        """Causal attention of each sequence's new tokens over its whole context, read in place from the
        paged cache, all sequences in one call. `bf16`: products of bfloat16-rounded operands (only where
        `bf16_prefill_address` is set)."""
        assert out.is_contiguous() and out.shape == q.shape
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and v_cache.shape == k_cache.shape
        q = q if _rows_ok(q) else q.contiguous()
        _, block_size, kv_heads, dim = k_cache.shape
        tables = block_tables.to(torch.int32).contiguous()
        meta = prefill_arguments(sequences)
        run = self.bf16_prefill_address if bf16 else self.prefill_address
        if run is None:
            raise ValueError("bfloat16 prefill attention needs a CPU with AVX512-BF16")
        # a 16- or 8-bit cache: the blocks read converted to float32 first (paged_prefill_kv), float32 as it is
        failed = self._prefill_kv(
            run, KV_DTYPES[k_cache.dtype], q.data_ptr(), q.stride(0), out.data_ptr(), k_cache.data_ptr(),
            v_cache.data_ptr(), scales_address(k_cache), scales_address(v_cache), tables.data_ptr(), tables.shape[1],
            *(row.data_ptr() for row in meta),
            len(sequences), q.shape[1], kv_heads, dim, block_size, scale, torch.get_num_threads(),
        )
        if failed:
            raise MemoryError("prefill attention kernel: no memory for its scratch")


def prefill_arguments(sequences: list[PrefillSequence]) -> torch.Tensor:
    """What `paged_prefill_f32` takes for these sequences: [4, S] int64 rows (table rows, first query rows,
    query counts, context lengths)."""
    return torch.tensor([[s.table_row for s in sequences], [s.first_row for s in sequences],
                         [s.num_queries for s in sequences], [s.context_len for s in sequences]], dtype=torch.int64)


@dataclass(frozen=True)
class PrefillSequence:
    """One sequence of a prefill call: its queries are rows first_row .. first_row + num_queries of q, the
    last num_queries positions of its context_len-token context, whose K/V are in the cache through row
    table_row of the block tables."""

    first_row: int
    num_queries: int
    context_len: int
    table_row: int


def _self_check(kernels: CpuAttentionKernels) -> None:
    """Both kernels on a tiny ragged batch against plain torch: a library that loads but computes wrong
    (a miscompile, a stale cache) must not serve requests."""
    gen = torch.Generator().manual_seed(0)
    # lengths that take the decode kernel through all its key steps: VL keys, 4 keys and single keys
    heads, kv_heads, dim, block_size, lens = 6, 2, 32, 16, [1, 21, 38]
    tables = torch.arange(12, dtype=torch.int32).view(3, 4)
    k_cache, v_cache = (torch.randn(12, block_size, kv_heads, dim, generator=gen) for _ in range(2))
    q = torch.randn(3, heads, dim, generator=gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32)

    def want(i: int, n: int, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        k, v = (read_cache(c)[tables[i].long()].reshape(-1, kv_heads, dim)[:n].repeat_interleave(heads // kv_heads, 1)
                for c in (k_cache, v_cache))
        return torch.einsum("hk,khd->hd", (torch.einsum("hd,khd->hk", q[i], k) * 0.125).softmax(-1), v)

    got = kernels.decode(q, k_cache, v_cache, tables, seq_lens, max(lens), 0.125)
    # the same sequences copied into a batch big enough for one work item per sequence (4 a thread)
    copies = -(-4 * torch.get_num_threads() // len(lens))
    batched = kernels.decode(q.repeat(copies, 1, 1), k_cache, v_cache, tables.repeat(copies, 1),
                             seq_lens.repeat(copies), max(lens), 0.125).view(copies, len(lens), heads, dim)
    for i, n in enumerate(lens):
        if not all(torch.allclose(out, want(i, n, k_cache, v_cache, tables), rtol=1e-4, atol=1e-5)
                   for out in (got[i], *batched[:, i])):
            raise RuntimeError("paged decode kernel disagrees with torch")
    # one long context, split over the threads, from each cache type (converted as read: exact up to the sums)
    long_table = torch.randperm(40, generator=gen).to(torch.int32)[None]
    long_k, long_v = (torch.randn(40, block_size, kv_heads, dim, generator=gen) for _ in range(2))
    for dtype in KV_DTYPES:
        k16, v16 = cache_of(long_k, dtype), cache_of(long_v, dtype)
        out = kernels.decode(q[:1], k16, v16, long_table, torch.tensor([611], dtype=torch.int32), 611, 0.125)
        if not torch.allclose(out[0], want(0, 611, k16, v16, long_table), rtol=1e-4, atol=1e-5):
            raise RuntimeError(f"paged decode kernel disagrees with torch on a long {dtype} cache")
    qp = torch.randn(9, heads, dim, generator=gen)
    # a fresh prompt of 4 tokens, and 5 new tokens after 8 cached ones, read through tables 1 and 2, from each
    # cache type; bfloat16 products differ from float32 by the operands' rounding (~1e-2 here), a wrong kernel
    # by the values' size
    cases = [(dtype, False, 1e-5) for dtype in KV_DTYPES]
    if kernels.bf16_prefill_address:
        cases.append((torch.float32, True, 5e-2))
    for dtype, bf16, tolerance in cases:
        out = torch.empty_like(qp)
        k16, v16 = cache_of(k_cache, dtype), cache_of(v_cache, dtype)
        kernels.prefill(qp, out, k16, v16, tables, [PrefillSequence(0, 4, 4, 1), PrefillSequence(4, 5, 13, 2)],
                        0.125, bf16=bf16)
        for start, n, context, row in ((0, 4, 4, 1), (4, 5, 13, 2)):
            kp, vp = (read_cache(c)[tables[row]].reshape(-1, kv_heads, dim)[:context] for c in (k16, v16))
            mask = torch.ones(n, context, dtype=torch.bool).tril(context - n)
            expected = torch.nn.functional.scaled_dot_product_attention(
                qp[start:start + n].transpose(0, 1), kp.transpose(0, 1), vp.transpose(0, 1),
                attn_mask=mask, scale=0.125, enable_gqa=True).transpose(0, 1)
            if not torch.allclose(out[start:start + n], expected, rtol=1e-4, atol=tolerance):
                raise RuntimeError(f"prefill attention kernel{' (bfloat16)' if bf16 else ''} disagrees with torch "
                                   f"on a {dtype} cache")


def _sdpa_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The torch path's fresh-prompt attention (torch_paged._prefill), for the timing below."""
    out = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(0, 1).contiguous().unsqueeze(0) for x in (q, k, v)), is_causal=True, scale=scale,
        enable_gqa=True)
    return out[0].transpose(0, 1)


def _choose_prefill(kernels: CpuAttentionKernels) -> str:
    """Time the kernel against SDPA on a 1024-token prompt (8 query heads over 2 KV heads of 64; the gap
    grows with length, and long prompts are where prefill time matters), alternated, best of 2 after a
    warm-up (~0.5 s), and keep the faster for prompt chunks. Returns the reason, for the log."""
    forced = settings().cpu_prefill
    if forced in ("kernel", "torch"):
        kernels.prefill_wins = forced == "kernel"
        return f"forced by TGI_LLM_CPU_PREFILL={forced}"
    gen = torch.Generator().manual_seed(0)
    n, heads, kv_heads, dim, block_size = 1024, 8, 2, 64, 16
    q = torch.randn(n, heads, dim, generator=gen)
    k_cache, v_cache = (torch.randn(n // block_size, block_size, kv_heads, dim, generator=gen) for _ in range(2))
    k, v = k_cache.view(n, kv_heads, dim), v_cache.view(n, kv_heads, dim)
    tables = torch.arange(n // block_size, dtype=torch.int32)[None]
    out = torch.empty_like(q)
    seqs = [PrefillSequence(0, n, n, 0)]
    kernels.prefill(q[:64], out[:64], k_cache, v_cache, tables, [PrefillSequence(0, 64, 64, 0)], 0.125)  # warm-up
    _sdpa_prefill(q[:64], k[:64], v[:64], 0.125)
    best = {"kernel": float("inf"), "torch": float("inf")}
    for _ in range(2):
        t0 = time.perf_counter()
        kernels.prefill(q, out, k_cache, v_cache, tables, seqs, 0.125)
        t1 = time.perf_counter()
        _sdpa_prefill(q, k, v, 0.125)
        t2 = time.perf_counter()
        best["kernel"], best["torch"] = min(best["kernel"], t1 - t0), min(best["torch"], t2 - t1)
    kernels.prefill_wins = best["kernel"] <= best["torch"]
    return f"measured: kernel {best['kernel'] * 1e3:.1f} ms, SDPA {best['torch'] * 1e3:.1f} ms"


def _check(kernels: CpuAttentionKernels) -> str:
    """Both kernels against torch, then the faster prefill path for this machine."""
    _self_check(kernels)
    why = _choose_prefill(kernels)
    return f"C kernel for decode, {'C kernel' if kernels.prefill_wins else 'SDPA'} for prefill ({why})"


#: The compiled kernels, or None where they can't be built, load or pass their self-check, or are switched off
#: with TGI_LLM_CPU_KERNELS=0. Decided once per process (the model loader calls this before the server reports
#: ready) and logged once: any failure here only means the torch path.
cpu_attention_kernels = CheckedKernels("CPU attention", "TGI_LLM_CPU_KERNELS", lambda: settings().cpu_kernels,
                                       CpuAttentionKernels, _check)
