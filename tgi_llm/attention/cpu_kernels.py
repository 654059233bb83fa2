"""Paged decode attention for the CPU as a small C kernel, compiled on first use with the system compiler.

Why: the pure-torch decode path gathers every sequence's K/V blocks into a padded copy for each layer
(index_select), then runs SDPA over it. That copy moves three times the bytes attention needs, and
SDPA's CPU kernel is slow for one query per sequence; together they cost more than all the model's
matmuls at batch 32. This kernel reads K/V in place through the block table, one sequence per OpenMP
work item, and is ~4x faster (docs/PERFORMANCE.md).

Plain C called through ctypes (no torch headers: builds in about a second). It links `libgomp.so.1`,
which the loader resolves to the copy torch already loaded, so it shares torch's thread pool. The
shared object is cached under `$TGI_LLM_KERNEL_CACHE` (default `~/.cache/tgi_llm/kernels`), keyed by
source, flags and CPU. Without a working compiler every caller falls back to the torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t i16v __attribute__((vector_size(64)));

static inline v16 ld(const float* p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float* p, v16 v) { memcpy(p, &v, sizeof v); }

/* r[t] = sum of the lanes of a[t], for 16 vectors at once (a transpose-and-add tree: 45 ops, not 16 x 8). */
static inline v16 sum16x16(const v16* a) {
    const i16v m1a = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const i16v m1b = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const i16v m2a = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const i16v m2b = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    const i16v m3a = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const i16v m3b = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
    const i16v m4a = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const i16v m4b = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    v16 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++)
        b[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], m1a) + __builtin_shuffle(a[2 * i], a[2 * i + 1], m1b);
    for (int i = 0; i < 4; i++)
        c[i] = __builtin_shuffle(b[2 * i], b[2 * i + 1], m2a) + __builtin_shuffle(b[2 * i], b[2 * i + 1], m2b);
    for (int i = 0; i < 2; i++)
        d[i] = __builtin_shuffle(c[2 * i], c[2 * i + 1], m3a) + __builtin_shuffle(c[2 * i], c[2 * i + 1], m3b);
    return __builtin_shuffle(d[0], d[1], m4a) + __builtin_shuffle(d[0], d[1], m4b);
}

/* exp(x) for x <= 0 (Cephes expf, ~1 ulp); written to vectorize, so no libm call per element. */
static inline float exp_nonpos(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

static inline void prefetch_block(const float* p, int64_t floats) {
    /* the hardware prefetcher stops at page edges and blocks are scattered */
    for (int64_t o = 0; o < floats; o += 16) __builtin_prefetch(p + o);
}

static inline __attribute__((always_inline)) void decode_one(
    const float* restrict qb, const float* restrict kc, const float* restrict vc, const int32_t* restrict table,
    const int64_t L, float* restrict s, float* restrict ob, const int64_t Hq, const int64_t Hkv, const int64_t D,
    const int64_t BS, const int64_t max_len, const float scale) {
    const int64_t G = Hq / Hkv, tok = Hkv * D, C = D / 16;
    v16 part[Hq][16];
    /* scores = scale * q . k, 16 tokens at a time */
    for (int64_t l0 = 0, j = 0; l0 < L; l0 += BS, j++) {
        const int64_t n = L - l0 < BS ? L - l0 : BS;
        const float* blk = kc + (int64_t)table[j] * BS * tok;
        if (l0 + BS < L) prefetch_block(kc + (int64_t)table[j + 1] * BS * tok, BS * tok);
        for (int64_t t0 = 0; t0 < n; t0 += 16) {
            const int64_t m = n - t0 < 16 ? n - t0 : 16;
            for (int64_t t = 0; t < 16; t++) {
                if (t >= m) {
                    for (int64_t hq = 0; hq < Hq; hq++) part[hq][t] = (v16){0};
                    continue;
                }
                const float* kp = blk + (t0 + t) * tok;
                for (int64_t h = 0; h < Hkv; h++)
                    for (int64_t g = 0; g < G; g++) {
                        const float* qh = qb + (h * G + g) * D;
                        v16 acc = ld(qh) * ld(kp + h * D);
                        for (int64_t c = 1; c < C; c++) acc += ld(qh + 16 * c) * ld(kp + h * D + 16 * c);
                        part[h * G + g][t] = acc;
                    }
            }
            for (int64_t hq = 0; hq < Hq; hq++) {
                float r[16];
                st(r, sum16x16(part[hq]) * scale);
                memcpy(s + hq * max_len + l0 + t0, r, m * sizeof(float));
            }
        }
    }
    /* softmax over the L scores of each query head */
    for (int64_t hq = 0; hq < Hq; hq++) {
        float* sh = s + hq * max_len;
        float mx = -INFINITY, sum = 0.f;
#pragma omp simd reduction(max : mx)
        for (int64_t l = 0; l < L; l++) mx = sh[l] > mx ? sh[l] : mx;
#pragma omp simd reduction(+ : sum)
        for (int64_t l = 0; l < L; l++) {
            sh[l] = exp_nonpos(sh[l] - mx);
            sum += sh[l];
        }
        const float inv = 1.f / sum;
#pragma omp simd
        for (int64_t l = 0; l < L; l++) sh[l] *= inv;
    }
    /* out = p . v, per query head and 16 lanes of D, so the accumulator stays in a register */
    memset(ob, 0, Hq * D * sizeof(float));
    for (int64_t l0 = 0, j = 0; l0 < L; l0 += BS, j++) {
        const int64_t n = L - l0 < BS ? L - l0 : BS;
        const float* blk = vc + (int64_t)table[j] * BS * tok;
        if (l0 + BS < L) prefetch_block(vc + (int64_t)table[j + 1] * BS * tok, BS * tok);
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t g = 0; g < G; g++) {
                const int64_t hq = h * G + g;
                const float* p = s + hq * max_len + l0;
                for (int64_t c = 0; c < C; c++) {
                    v16 acc = ld(ob + hq * D + 16 * c);
                    const float* vp = blk + h * D + 16 * c;
                    for (int64_t t = 0; t < n; t++) acc += p[t] * ld(vp + t * tok);
                    st(ob + hq * D + 16 * c, acc);
                }
            }
    }
}

/* q, out: [B, Hq, D]; k_cache, v_cache: [num_blocks, BS, Hkv, D]; block_tables: [B, W] int32;
   seq_lens: [B] int32; scores: [B, Hq, max_len] scratch. All float32, contiguous, D % 16 == 0. */
void paged_decode_f32(const float* restrict q, const float* restrict kc, const float* restrict vc,
                      const int32_t* restrict block_tables, const int32_t* restrict seq_lens, float* restrict out,
                      float* restrict scores, int64_t B, int64_t Hq, int64_t Hkv, int64_t D, int64_t BS, int64_t W,
                      int64_t max_len, float scale, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static, 1)
    for (int64_t b = 0; b < B; b++) {
        const float* qb = q + b * Hq * D;
        float* s = scores + b * Hq * max_len;
        float* ob = out + b * Hq * D;
        const int32_t* table = block_tables + b * W;
        if (D == 64)  /* the common head size, with its loop bounds known to the compiler */
            decode_one(qb, kc, vc, table, seq_lens[b], s, ob, Hq, Hkv, 64, BS, max_len, scale);
        else
            decode_one(qb, kc, vc, table, seq_lens[b], s, ob, Hq, Hkv, D, BS, max_len, scale);
    }
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11"]
#: The kernel keeps 16 partial vectors per query head on the stack.
_MAX_QUERY_HEADS = 256


def _cpu_id() -> str:
    """What -march=native depends on, so a cache shared between machines never runs foreign code."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(dict.fromkeys(keep))
    except OSError:
        return platform.processor()


def _cache_dir() -> Path:
    env = os.environ.get("TGI_LLM_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tgi_llm" / "kernels"


def _build(compiler: str) -> Path:
    key = hashlib.sha256("\0".join([_SOURCE, compiler, *_FLAGS, _cpu_id()]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"paged_decode_{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "paged_decode.c"
        src.write_text(_SOURCE)
        out = Path(tmp) / target.name
        subprocess.run([compiler, *_FLAGS, str(src), "-o", str(out)], check=True, capture_output=True, text=True,
                       timeout=300)
        os.replace(out, target)  # atomic: concurrent builders (TP ranks, test workers) never see half a file
    logger.info("built the CPU paged-attention kernel: %s", target)
    return target


class PagedDecodeKernel:
    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        fn = lib.paged_decode_f32
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        fn.argtypes = [ptr] * 7 + [i64] * 7 + [ctypes.c_float, ctypes.c_int]
        fn.restype = None
        self._lib, self._fn = lib, fn

    @staticmethod
    def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        return (
            q.device.type == "cpu"
            and q.dtype == torch.float32
            and k_cache.dtype == torch.float32
            and q.shape[-1] % 16 == 0
            and q.shape[1] <= _MAX_QUERY_HEADS
            and k_cache.is_contiguous()
        )

    def __call__(
        self,
        q: torch.Tensor,  # [B, Hq, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [B, >= blocks needed] int32
        seq_lens: torch.Tensor,  # [B] int32
        max_seq_len: int,
        scale: float,
    ) -> torch.Tensor:
        batch, heads, dim = q.shape
        _, block_size, kv_heads, _ = k_cache.shape
        q = q.contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        lens = seq_lens.to(torch.int32).contiguous()
        assert v_cache.is_contiguous() and v_cache.shape == k_cache.shape
        out = torch.empty_like(q)
        scores = torch.empty((batch, heads, max_seq_len), dtype=torch.float32)
        self._fn(
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(),
            out.data_ptr(), scores.data_ptr(), batch, heads, kv_heads, dim, block_size, tables.shape[1],
            max_seq_len, scale, torch.get_num_threads(),
        )
        return out


_lock = threading.Lock()
_kernel: PagedDecodeKernel | None = None
_tried = False


def paged_decode_kernel() -> PagedDecodeKernel | None:
    """The compiled kernel, or None (logged once) where it can't be built or is switched off with
    TGI_LLM_CPU_KERNELS=0."""
    global _kernel, _tried
    if _tried:
        return _kernel
    with _lock:
        if not _tried:
            if os.environ.get("TGI_LLM_CPU_KERNELS", "1") == "0":
                logger.info("CPU attention kernel switched off (TGI_LLM_CPU_KERNELS=0)")
            else:
                try:
                    _kernel = PagedDecodeKernel(_build(os.environ.get("CC", "cc")))
                except (OSError, subprocess.SubprocessError) as exc:
                    detail = getattr(exc, "stderr", "") or exc
                    logger.warning("CPU attention kernel unavailable, using the torch path: %s", detail)
            _tried = True
    return _kernel
