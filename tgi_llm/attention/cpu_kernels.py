"""Attention for the CPU as two small C kernels, compiled with the system compiler while the model loads.

Decode: the pure-torch path gathers every sequence's K/V blocks into a padded copy for each layer
(index_select), then runs SDPA over it. That copy moves three times the bytes attention needs, and SDPA's
CPU kernel is slow for one query per sequence; together they cost more than all the model's matmuls at
batch 32. `paged_decode_f32` reads K/V in place through the block table, one sequence per OpenMP work
item: ~4x faster. Prefill: SDPA's CPU flash kernel runs its small GEMMs through MKL, which takes no
AVX-512 path on AMD CPUs; `prefill_attention_f32` (keys transposed into 16-key tiles, 16-row query tiles,
online softmax, every prompt of the step in one call) is ~2.4x faster. Numbers in docs/PERFORMANCE.md.

Which prefill is faster differs by machine: the kernel was ~2.4x faster than SDPA on an AVX-512 Zen 5, and
4-6x slower on an AVX2 Zen 3 (its 64-byte vectors become register pairs there; SDPA's flash kernel on
contiguous inputs is fast). So the prefill path is measured once at load, kernel against SDPA on one
prompt-sized shape, and the faster serves (`TGI_LLM_CPU_PREFILL=kernel|torch` forces one); decode keeps
the kernel, which wins on both (3-4x at batch 8-32 on the Zen 3).

Plain C called through ctypes (no torch headers: builds in about a second). It links `libgomp.so.1`,
which the loader resolves to the copy torch already loaded, so it shares torch's thread pool. Built and
cached by `tgi_llm.native_build` (keyed by source, compiler, flags and CPU). The kernels are optional:
without a working compiler, or if they fail their self-check, every caller uses the torch path.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tgi_llm.native_build import build_library
from tgi_llm.native_vectors import VECTORS_C

logger = logging.getLogger(__name__)

_SOURCE = VECTORS_C + r"""
#include <math.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t i16v __attribute__((vector_size(64)));

#define MAX_CHUNKS 16 /* head size up to 256 */

static inline v16 ld(const float* p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float* p, v16 v) { memcpy(p, &v, sizeof v); }
static inline v16 splat(float x) { return (v16){0} + x; }

static inline v16 vsel(i16v m, v16 a, v16 b) { /* m ? a : b per lane (C has no vector ?:) */
    i16v ai, bi, r;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    r = (ai & m) | (bi & ~m);
    v16 out;
    memcpy(&out, &r, sizeof out);
    return out;
}

static inline float hmax(v16 v) {
    float t[16], m;
    st(t, v);
    m = t[0];
    for (int i = 1; i < 16; i++) m = t[i] > m ? t[i] : m;
    return m;
}

static inline float hsum(v16 v) {
    float t[16], s = 0.f;
    st(t, v);
    for (int i = 0; i < 16; i++) s += t[i];
    return s;
}

/* exp on 16 lanes, for x <= 0 (Cephes expf, ~1 ulp; below -87 it returns ~1e-38, never 0). */
static inline v16 exp16(v16 x) {
    const v16 lo = splat(-87.0f), magic = splat(12582912.0f); /* 1.5 * 2^23: round to nearest */
    x = vsel(x < lo, lo, x);
    v16 n = (x * 1.44269504088896341f + magic) - magic;
    v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
    v16 p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    i16v e = (__builtin_convertvector(n, i16v) + 127) << 23;
    v16 scale;
    memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

/* ---- decode: one query per sequence, K/V read in place through the block table ----
   One work item per (sequence, KV head): its G query heads' scores against every key (4 keys at a time,
   their rows kept in L1 across the G heads), a softmax, then p . v. Bound by the bytes of K and V. */

#define MAX_DV (256 / VL) /* head size up to 256 */

static inline void prefetch_rows(const float* p, const int64_t rows, const int64_t stride, const int64_t D) {
    /* the hardware prefetcher stops at page edges and blocks are scattered */
    for (int64_t t = 0; t < rows; t++)
        for (int64_t o = 0; o < D; o += 16) __builtin_prefetch(p + t * stride + o);
}

static inline __attribute__((always_inline)) void decode_head(
    const float* restrict qh, const float* restrict kc, const float* restrict vc, const int32_t* restrict table,
    const int64_t L, float* restrict s, float* restrict oh, const int64_t G, const int64_t tok, const int64_t D,
    const int64_t BS, const int64_t stride, const float scale) {
    /* qh, oh: this KV head's G query heads [G][D]; s: their score rows [G][stride]; kc/vc: offset to the head */
    const int64_t C = D / VL;
    float q[G * D];
    for (int64_t i = 0; i < G * D; i++) q[i] = qh[i] * scale;
    for (int64_t l0 = 0, j = 0; l0 < L; l0 += BS, j++) {
        const int64_t n = L - l0 < BS ? L - l0 : BS;
        const float* kb = kc + (int64_t)table[j] * BS * tok;
        if (l0 + BS < L) prefetch_rows(kc + (int64_t)table[j + 1] * BS * tok, BS, tok, D);
        int64_t t = 0;
        for (; t + 4 <= n; t += 4)
            for (int64_t g = 0; g < G; g++) {
                V a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
                for (int64_t c = 0; c < C; c++) {
                    const V qv = vld(q + g * D + c * VL);
                    a0 = vfma(qv, vld(kb + t * tok + c * VL), a0);
                    a1 = vfma(qv, vld(kb + (t + 1) * tok + c * VL), a1);
                    a2 = vfma(qv, vld(kb + (t + 2) * tok + c * VL), a2);
                    a3 = vfma(qv, vld(kb + (t + 3) * tok + c * VL), a3);
                }
                vsum4(a0, a1, a2, a3, s + g * stride + l0 + t);
            }
        for (; t < n; t++)
            for (int64_t g = 0; g < G; g++) {
                V a = vzero();
                for (int64_t c = 0; c < C; c++) a = vfma(vld(q + g * D + c * VL), vld(kb + t * tok + c * VL), a);
                s[g * stride + l0 + t] = vsum(a);
            }
    }
    /* softmax numerators in place; the 1/sum is applied to the output */
    float inv[G];
    const int64_t Lv = L / VL * VL;
    for (int64_t g = 0; g < G; g++) {
        float* row = s + g * stride;
        V mv = vset1(-INFINITY);
        for (int64_t l = 0; l < Lv; l += VL) mv = vmax(mv, vld(row + l));
        float mx = vhmax(mv);
        for (int64_t l = Lv; l < L; l++) mx = row[l] > mx ? row[l] : mx;
        V sv = vzero();
        for (int64_t l = 0; l < Lv; l += VL) {
            const V e = vexp(vld(row + l) - mx);
            vst(row + l, e);
            sv = vadd(sv, e);
        }
        float sum = vsum(sv);
        for (int64_t l = Lv; l < L; l++) {
            row[l] = expf(row[l] - mx);
            sum += row[l];
        }
        inv[g] = 1.f / sum;
    }
    /* out = p . v: per query head, D / VL accumulators in registers over a block */
    for (int64_t i = 0; i < G * D; i++) oh[i] = 0.f;
    for (int64_t l0 = 0, j = 0; l0 < L; l0 += BS, j++) {
        const int64_t n = L - l0 < BS ? L - l0 : BS;
        const float* vb = vc + (int64_t)table[j] * BS * tok;
        if (l0 + BS < L) prefetch_rows(vc + (int64_t)table[j + 1] * BS * tok, BS, tok, D);
        for (int64_t g = 0; g < G; g++) {
            const float* p = s + g * stride + l0;
            V acc[MAX_DV];
            for (int64_t c = 0; c < C; c++) acc[c] = vld(oh + g * D + c * VL);
            for (int64_t t = 0; t < n; t++) {
                const V pt = vset1(p[t]);
                for (int64_t c = 0; c < C; c++) acc[c] = vfma(pt, vld(vb + t * tok + c * VL), acc[c]);
            }
            for (int64_t c = 0; c < C; c++) vst(oh + g * D + c * VL, acc[c]);
        }
    }
    for (int64_t g = 0; g < G; g++)
        for (int64_t c = 0; c < C; c++) vst(oh + g * D + c * VL, vmul(vld(oh + g * D + c * VL), vset1(inv[g])));
}

/* q, out: [B, Hq, D]; k_cache, v_cache: [num_blocks, BS, Hkv, D]; block_tables: [B, W] int32;
   seq_lens: [B] int32; scores: [B, Hq, stride] scratch, stride >= max seq_len rounded up to 16.
   All float32, contiguous, D % 16 == 0. */
void paged_decode_f32(const float* restrict q, const float* restrict kc, const float* restrict vc,
                      const int32_t* restrict block_tables, const int32_t* restrict seq_lens, float* restrict out,
                      float* restrict scores, int64_t B, int64_t Hq, int64_t Hkv, int64_t D, int64_t BS, int64_t W,
                      int64_t stride, float scale, int nthreads) {
    const int64_t G = Hq / Hkv, tok = Hkv * D;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) /* lengths differ: balance */
    for (int64_t i = 0; i < B * Hkv; i++) {
        const int64_t b = i / Hkv, h = i % Hkv, off = (b * Hq + h * G) * D;
        float* s = scores + (b * Hq + h * G) * stride;
        const int32_t* table = block_tables + b * W;
        if (D == 64) /* the common head size, with its loop bounds known to the compiler */
            decode_head(q + off, kc + h * D, vc + h * D, table, seq_lens[b], s, out + off, G, tok, 64, BS, stride,
                        scale);
        else
            decode_head(q + off, kc + h * D, vc + h * D, table, seq_lens[b], s, out + off, G, tok, D, BS, stride,
                        scale);
    }
}

/* ---- prefill: causal attention of a sequence's new tokens over its context (flash style) ---- */

/* Keys of one (sequence, kv head) as [tiles][D][16]: a 16-key tile's d-th components are one vector, so
   q . k for 16 keys is D multiply-adds with no horizontal sums. Zero past L. */
static void transpose_keys(const float* restrict k, const int64_t ks, const int64_t h, const int64_t D,
                           const int64_t L, float* restrict kt) {
    for (int64_t j = 0; j < (L + 15) / 16; j++)
        for (int64_t t = 0; t < 16; t++) {
            float* dst = kt + j * D * 16 + t;
            const int64_t row = j * 16 + t;
            if (row < L) {
                const float* src = k + row * ks + h * D;
                for (int64_t d = 0; d < D; d++) dst[d * 16] = src[d];
            } else {
                for (int64_t d = 0; d < D; d++) dst[d * 16] = 0.f;
            }
        }
}

#define QK_GROUP 8 /* queries whose scores accumulate together: independent FMA chains */
#define PV_GROUP 4

static inline __attribute__((always_inline)) void prefill_tile(
    const float* restrict q, const int64_t qs, const float* restrict kt, const float* restrict v, const int64_t vs,
    float* restrict out, const int64_t L, const int64_t off, const int64_t i0, const int64_t h, const int64_t G,
    const int64_t Hq, const int64_t D, const float scale) {
    /* L queries at context positions off .. off + L - 1; this tile: queries i0 .. i0 + m - 1 */
    const int64_t C = D / 16, m = L - i0 < 16 ? L - i0 : 16, NQ = m * G;
    const int64_t NQP = (NQ + QK_GROUP - 1) / QK_GROUP * QK_GROUP;
    const i16v lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    float qf[NQP][D], mx[NQ], lsum[NQ], p[NQP][16];
    v16 acc[NQP][C];
    for (int64_t qi = 0; qi < NQP; qi++) {
        for (int64_t c = 0; c < C; c++) acc[qi][c] = (v16){0};
        if (qi >= NQ) {
            memset(qf[qi], 0, D * sizeof(float));
            memset(p[qi], 0, sizeof p[qi]);
            continue;
        }
        const float* qp = q + (i0 + qi / G) * qs + (h * G + qi % G) * D;
        for (int64_t d = 0; d < D; d++) qf[qi][d] = qp[d] * scale;
        mx[qi] = -INFINITY;
        lsum[qi] = 0.f;
    }
    for (int64_t j0 = 0; j0 < off + i0 + m; j0 += 16) {
        const int64_t nk = off + i0 + m - j0 < 16 ? off + i0 + m - j0 : 16;
        const float* ktile = kt + (j0 / 16) * D * 16;
        for (int64_t g0 = 0; g0 < NQP; g0 += QK_GROUP) {
            v16 s[QK_GROUP];
            for (int i = 0; i < QK_GROUP; i++) s[i] = (v16){0};
            for (int64_t d = 0; d < D; d++) {
                const v16 kv = ld(ktile + d * 16);
                for (int i = 0; i < QK_GROUP; i++) s[i] += qf[g0 + i][d] * kv;
            }
            for (int i = 0; i < QK_GROUP && g0 + i < NQ; i++) {
                const int64_t qi = g0 + i;
                /* key j0 + t is visible to query row i0 + qi / G when j0 + t <= off + i0 + qi / G (key 0 is
                   visible to every row, so the running max is finite after the first tile) */
                const i16v visible = lane + (int32_t)j0 <= (int32_t)(off + i0 + qi / G);
                const v16 sc = vsel(visible, s[i], splat(-INFINITY));
                const float tmax = hmax(sc), mnew = tmax > mx[qi] ? tmax : mx[qi];
                const v16 e = vsel(visible, exp16(sc - mnew), (v16){0});
                st(p[qi], e);
                if (mnew > mx[qi] && mx[qi] != -INFINITY) { /* rescale what was summed under the old max */
                    float corr[16];
                    st(corr, exp16(splat(mx[qi] - mnew)));
                    lsum[qi] *= corr[0];
                    for (int64_t c = 0; c < C; c++) acc[qi][c] *= corr[0];
                }
                mx[qi] = mnew;
                lsum[qi] += hsum(e);
            }
        }
        for (int64_t g0 = 0; g0 < NQ; g0 += PV_GROUP)
            for (int64_t c = 0; c < C; c++) {
                v16 a[PV_GROUP];
                for (int i = 0; i < PV_GROUP; i++) a[i] = acc[g0 + i][c];
                for (int64_t t = 0; t < nk; t++) {
                    const v16 vv = ld(v + (j0 + t) * vs + h * D + 16 * c);
                    for (int i = 0; i < PV_GROUP; i++) a[i] += p[g0 + i][t] * vv;
                }
                for (int i = 0; i < PV_GROUP; i++) acc[g0 + i][c] = a[i];
            }
    }
    for (int64_t qi = 0; qi < NQ; qi++) {
        const float inv = 1.f / lsum[qi];
        float* op = out + ((i0 + qi / G) * Hq + h * G + qi % G) * D;
        for (int64_t c = 0; c < C; c++) st(op + 16 * c, acc[qi][c] * inv);
    }
}

/* Sequence s: queries are rows qstart[s] .. qstart[s] + qlen[s] of q (row stride qs) and out ([T, Hq, D]
   contiguous); its context is klen[s] >= qlen[s] keys and values at kaddr[s] / vaddr[s] (row strides
   kstride[s] / vstride[s], heads of D contiguous), the queries being the last qlen[s] of them. kt: scratch,
   klen[s] rounded up to 16 times Hkv * D floats at ktoff[s]. Work items: (sequence, query tile, kv head),
   latest tiles (the most keys) first so the dynamic schedule ends balanced. */
void prefill_attention_f32(const float* q, int64_t qs, float* out, const int64_t* kaddr, const int64_t* kstride,
                           const int64_t* vaddr, const int64_t* vstride, float* kt, const int64_t* qstart,
                           const int64_t* qlen, const int64_t* klen, const int64_t* ktoff, int64_t S, int64_t Hq,
                           int64_t Hkv, int64_t D, float scale, int nthreads) {
    int64_t items = 0;
    for (int64_t s = 0; s < S; s++) items += Hkv * ((qlen[s] + 15) / 16);
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t sh = 0; sh < S * Hkv; sh++) {
            const int64_t s = sh / Hkv, h = sh % Hkv;
            transpose_keys((const float*)kaddr[s], kstride[s], h, D, klen[s],
                           kt + ktoff[s] + h * ((klen[s] + 15) / 16) * 16 * D);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t rest = it, s = 0;
            while (rest >= Hkv * ((qlen[s] + 15) / 16)) rest -= Hkv * ((qlen[s++] + 15) / 16);
            const int64_t tiles = (qlen[s] + 15) / 16, ktiles = (klen[s] + 15) / 16;
            const int64_t tile = tiles - 1 - rest / Hkv, h = rest % Hkv, G = Hq / Hkv, off = klen[s] - qlen[s];
            const float *qq = q + qstart[s] * qs, *vv = (const float*)vaddr[s];
            const float* kk = kt + ktoff[s] + h * ktiles * 16 * D;
            float* oo = out + qstart[s] * Hq * D;
            const int64_t vs = vstride[s];
            if (D == 64 && G == 3)
                prefill_tile(qq, qs, kk, vv, vs, oo, qlen[s], off, tile * 16, h, 3, Hq, 64, scale);
            else if (D == 64)
                prefill_tile(qq, qs, kk, vv, vs, oo, qlen[s], off, tile * 16, h, G, Hq, 64, scale);
            else
                prefill_tile(qq, qs, kk, vv, vs, oo, qlen[s], off, tile * 16, h, G, Hq, D, scale);
        }
    }
}
"""

#: The decode kernel keeps 16 partial vectors per query head on the stack.
_MAX_QUERY_HEADS = 256


def _rows_ok(x: torch.Tensor) -> bool:
    """[T, H, D] with each row's heads back to back (any row stride): views of the fused qkv output."""
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


class CpuAttentionKernels:
    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        ptr, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
        self._decode = lib.paged_decode_f32
        self._decode.argtypes = [ptr] * 7 + [i64] * 7 + [f32, i32]
        self._decode.restype = None
        self._prefill = lib.prefill_attention_f32
        self._prefill.argtypes = [ptr, i64] + [ptr] * 10 + [i64] * 4 + [f32, i32]
        self._prefill.restype = None
        self._lib = lib
        #: Prompt chunks through the prefill kernel (True) or SDPA (False): measured at load (_choose_prefill).
        self.prefill_wins = True

    @staticmethod
    def supports(q: torch.Tensor, k: torch.Tensor) -> bool:
        """q [T, Hq, D]; k: the cache ([blocks, block_size, Hkv, D], decode) or the new keys ([T, Hkv, D])."""
        dim = q.shape[-1]
        return (
            q.device.type == "cpu"
            and q.dtype == torch.float32
            and k.dtype == torch.float32
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
        self._decode(
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(),
            out.data_ptr(), scores.data_ptr(), batch, heads, kv_heads, dim, block_size, tables.shape[1],
            stride, scale, torch.get_num_threads(),
        )
        return out

    def prefill(
        self,
        q: torch.Tensor,  # [T, Hq, D] (rows may be strided)
        out: torch.Tensor,  # [T, Hq, D] contiguous; the sequences' rows are written
        sequences: list[PrefillSequence],
        scale: float,
    ) -> None:
        """Causal attention of each sequence's new tokens over its whole context, all sequences in one call."""
        assert out.is_contiguous() and out.shape == q.shape
        q = q if _rows_ok(q) else q.contiguous()
        heads, dim = q.shape[1], q.shape[2]
        kv_heads = sequences[0].keys.shape[1]
        keys = [s.keys if _rows_ok(s.keys) else s.keys.contiguous() for s in sequences]
        values = [s.values if _rows_ok(s.values) else s.values.contiguous() for s in sequences]
        padded = [-(-k.shape[0] // 16) * 16 for k in keys]  # keys are transposed into 16-key tiles
        offsets = [0]
        for n in padded[:-1]:
            offsets.append(offsets[-1] + n * kv_heads * dim)
        meta = torch.tensor([
            [k.data_ptr() for k in keys], [k.stride(0) for k in keys],
            [v.data_ptr() for v in values], [v.stride(0) for v in values],
            [s.first_row for s in sequences], [s.num_queries for s in sequences], [k.shape[0] for k in keys], offsets,
        ], dtype=torch.int64)
        key_tiles = torch.empty(sum(padded) * kv_heads * dim, dtype=torch.float32)
        self._prefill(
            q.data_ptr(), q.stride(0), out.data_ptr(), *(row.data_ptr() for row in meta[:4]), key_tiles.data_ptr(),
            *(row.data_ptr() for row in meta[4:]), len(sequences), heads, kv_heads, dim, scale,
            torch.get_num_threads(),
        )


@dataclass(frozen=True)
class PrefillSequence:
    """One sequence of a prefill call: its queries are rows first_row .. first_row + num_queries of q, and
    the last num_queries of its context's keys/values ([L, Hkv, D] each, L >= num_queries)."""

    first_row: int
    num_queries: int
    keys: torch.Tensor
    values: torch.Tensor


_lock = threading.Lock()
_kernels: CpuAttentionKernels | None = None
_tried = False


def _self_check(kernels: CpuAttentionKernels) -> None:
    """Both kernels on a tiny ragged batch against plain torch: a library that loads but computes wrong
    (a miscompile, a stale cache) must not serve requests."""
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, block_size, lens = 6, 2, 32, 4, [1, 5, 9]
    tables = torch.arange(12, dtype=torch.int32).view(3, 4)
    k_cache, v_cache = (torch.randn(12, block_size, kv_heads, dim, generator=gen) for _ in range(2))
    q = torch.randn(3, heads, dim, generator=gen)
    got = kernels.decode(q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), max(lens), 0.125)
    for i, n in enumerate(lens):
        k = k_cache[tables[i]].reshape(-1, kv_heads, dim)[:n].repeat_interleave(heads // kv_heads, 1)
        v = v_cache[tables[i]].reshape(-1, kv_heads, dim)[:n].repeat_interleave(heads // kv_heads, 1)
        want = torch.einsum("hk,khd->hd", (torch.einsum("hd,khd->hk", q[i], k) * 0.125).softmax(-1), v)
        if not torch.allclose(got[i], want, rtol=1e-4, atol=1e-5):
            raise RuntimeError("paged decode kernel disagrees with torch")
    qp = torch.randn(9, heads, dim, generator=gen)
    kp, vp = (torch.randn(13, kv_heads, dim, generator=gen) for _ in range(2))
    out = torch.empty_like(qp)
    # a fresh prompt of 4 tokens, and 5 new tokens after 8 cached ones
    kernels.prefill(qp, out, [PrefillSequence(0, 4, kp[:4], vp[:4]), PrefillSequence(4, 5, kp, vp)], 0.125)
    for start, n, context in ((0, 4, 4), (4, 5, 13)):
        mask = torch.ones(n, context, dtype=torch.bool).tril(context - n)
        want = torch.nn.functional.scaled_dot_product_attention(
            qp[start:start + n].transpose(0, 1), kp[:context].transpose(0, 1), vp[:context].transpose(0, 1),
            attn_mask=mask, scale=0.125, enable_gqa=True).transpose(0, 1)
        if not torch.allclose(out[start:start + n], want, rtol=1e-4, atol=1e-5):
            raise RuntimeError("prefill attention kernel disagrees with torch")


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
    forced = os.environ.get("TGI_LLM_CPU_PREFILL", "auto")
    if forced in ("kernel", "torch"):
        kernels.prefill_wins = forced == "kernel"
        return f"forced by TGI_LLM_CPU_PREFILL={forced}"
    gen = torch.Generator().manual_seed(0)
    n, heads, kv_heads, dim = 1024, 8, 2, 64
    q = torch.randn(n, heads, dim, generator=gen)
    k, v = (torch.randn(n, kv_heads, dim, generator=gen) for _ in range(2))
    out = torch.empty_like(q)
    seqs = [PrefillSequence(0, n, k, v)]
    kernels.prefill(q[:64], out[:64], [PrefillSequence(0, 64, k[:64], v[:64])], 0.125)  # warm-up: first-call costs
    _sdpa_prefill(q[:64], k[:64], v[:64], 0.125)
    best = {"kernel": float("inf"), "torch": float("inf")}
    for _ in range(2):
        t0 = time.perf_counter()
        kernels.prefill(q, out, seqs, 0.125)
        t1 = time.perf_counter()
        _sdpa_prefill(q, k, v, 0.125)
        t2 = time.perf_counter()
        best["kernel"], best["torch"] = min(best["kernel"], t1 - t0), min(best["torch"], t2 - t1)
    kernels.prefill_wins = best["kernel"] <= best["torch"]
    return f"measured: kernel {best['kernel'] * 1e3:.1f} ms, SDPA {best['torch'] * 1e3:.1f} ms"


def cpu_attention_kernels() -> CpuAttentionKernels | None:
    """The compiled kernels, or None where they can't be built, load or pass their self-check, or are
    switched off with TGI_LLM_CPU_KERNELS=0. Decided once per process (the model loader calls this before
    the server reports ready) and logged once: any failure here only means the torch path."""
    global _kernels, _tried
    if _tried:
        return _kernels
    with _lock:
        if not _tried:
            if os.environ.get("TGI_LLM_CPU_KERNELS", "1") == "0":
                logger.info("CPU attention: torch path (C kernels switched off by TGI_LLM_CPU_KERNELS=0)")
            else:
                try:
                    kernels = CpuAttentionKernels(build_library("cpu_attention", _SOURCE))
                    _self_check(kernels)
                    why = _choose_prefill(kernels)
                    _kernels = kernels
                    logger.info("CPU attention: C kernel for decode, %s for prefill (%s; pid %d)",
                                "C kernel" if kernels.prefill_wins else "SDPA", why, os.getpid())
                except Exception as exc:  # an optional fast path: whatever went wrong, serve with torch
                    logger.warning("CPU attention: torch path, the C kernels are unavailable (pid %d): %s",
                                   os.getpid(), exc)
            _tried = True
    return _kernels
