/* Paged attention for the CPU: decode (one query per sequence) and prefill (prompt chunks over their whole
   context), K/V read in place through the block tables. The Python side is tgi_llm/attention/cpu_kernels.py. */

#include "amx.h"
#include "kernels.h"
#include "vectors.h"
#include <math.h>
#include <stdlib.h>

/* ---- decode: one query per sequence, K/V read in place through the block table ----
   Each query head's scores against every key (VL keys at a time, their rows kept in L1 across the heads
   of a group), a softmax, then p . v (a KV head's query heads together). Bound by the bytes of K and V.
   Two shapes of work item, the same arithmetic in the same order (bit-equal outputs; a split context below
   sums in another order):
   - one per (sequence, KV head), when there are few sequences, so that every thread has work;
   - one per sequence, all its KV heads, from SEQ_ITEMS_PER_THREAD sequences a thread: a block's K (then
     V) rows are read as one contiguous run (BS x Hkv x D elements).
   Either way K is prefetched PREFETCH_AHEAD tokens ahead of its use, 4 token rows at a time, so that the
   core keeps a steady number of misses in flight instead of a block's worth at once. 2 threads, Zen 4,
   30 layers' caches in shuffled blocks, ragged lengths, per layer: 1 x 1,024 tokens 61 -> 54 us, 4 x 500
   120 -> 105 us, 8 x 300 174 -> 154 us, 16 x 400 425 -> 366 us, 32 x 700 1,415 -> 1,170 us
   (docs/PERFORMANCE.md item 25). V is prefetched a block ahead in the p . v pass; both prefetches are
   spread between the heads' work (item 40: 16 x 400 tokens 13.9 -> 12.5 ms for 30 layers, AMX Xeon).
   The cache holds float32, bfloat16 or float16 (kv_dtype_t, --kv-cache-dtype): each element is converted
   in registers as it is loaded and everything after is float32, so a 16-bit cache moves half the bytes
   through the same loops. An 8-bit cache (KV_Q8) likewise: a key's products with the codes are summed a
   group at a time and scaled once a group (score_q8), a value's codes are scaled as they are loaded.
   Few sequences with long contexts (fewer work items than SEQ_ITEMS_PER_THREAD a thread) split each
   (sequence, KV head) into parts of at least SPLIT_MIN_KEYS keys, flash-decoding's split-K: each part keeps
   its softmax's max and sum beside its output, and the parts are combined at the end, so that one stream's
   long context keeps every thread busy (SmolLM2's 3 KV heads on 2 threads left one idle a third of the
   time). */

#define MAX_DV (256 / VL) /* head size up to 256 */
#define SEQ_ITEMS_PER_THREAD 4 /* sequences a thread, for the dynamic schedule to balance unequal lengths */
#define MAX_SEQ_QUERY_FLOATS 8192 /* an item's scaled queries live on the worker's stack */
#define PREFETCH_AHEAD 16 /* tokens (8, 16 and 32 measured the same; no prefetch: 35% slower) */
#define SPLIT_MIN_KEYS 128 /* keys a part at least: its fixed costs (the queries, the prefetch's start) */

/* element i of a cache (or of a row) of kv_dtype_t `kind` */
static inline __attribute__((always_inline)) const void* kv_at(const void* base, const int64_t i, const int kind) {
    return (const char*)base + i * kv_bytes(kind);
}

/* VL cache elements from p, as float32 */
static inline __attribute__((always_inline)) V vld_kv(const void* p, const int kind) {
    if (kind == KV_BF16) return vld_bf16(p);
    if (kind == KV_F16) return vld_f16(p);
    return vld((const float*)p);
}

/* n token rows (tok elements apart) of a KV_Q8 cache from codes c and scales sc (c's element index / KV_Q8_GROUP):
   their first `width` elements as float32 rows of `width` in out */
static inline __attribute__((always_inline)) void dequant_q8_rows(const int8_t* c, const _Float16* sc, const int64_t n,
                                                                  const int64_t tok, const int64_t width,
                                                                  float* restrict out) {
    for (int64_t t = 0; t < n; t++) {
        const int8_t* r = c + t * tok;
        const _Float16* d = sc + t * (tok / KV_Q8_GROUP);
        float* o = out + t * width;
        for (int64_t g = 0; g < width / KV_Q8_GROUP; g++) {
            const V scale = vset1((float)d[g]);
            UNROLL for (int e = 0; e < KV_Q8_GROUP; e += VL)
                vst(o + g * KV_Q8_GROUP + e, vmul(vld_i8(r + g * KV_Q8_GROUP + e), scale));
        }
    }
}

static inline __attribute__((always_inline)) void prefetch_rows(const void* p, const int64_t rows,
                                                                const int64_t stride, const int64_t width,
                                                                const int kind) {
    /* the first `width` elements of `rows` rows `stride` elements apart. The hardware prefetcher stops at
       page edges and blocks are scattered. Into L2, not L1: a block's rows flushed the L1 lines the scores
       were using (16 sequences of 400 tokens on Zen 4: 775 -> 509 us a layer, K/V at 19 GB/s instead of 13) */
    const int64_t bytes = width * kv_bytes(kind);
    for (int64_t t = 0; t < rows; t++)
        for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char*)kv_at(p, t * stride, kind) + o, 0, 1);
}

static inline __attribute__((always_inline)) void prefetch_4_tokens(const void* c, const int32_t* table,
                                                                    const int64_t pos, const int64_t BS,
                                                                    const int64_t tok, const int64_t width,
                                                                    const int kind) {
    /* the first `width` elements of token rows pos .. pos + 3 (pos a multiple of 4: one block when BS is) */
    prefetch_rows(kv_at(c, ((int64_t)table[pos / BS] * BS + pos % BS) * tok, kind), 4, tok, width, kind);
}

/* 8-bit (KV_Q8) keys and values, converted in registers like the 16-bit types. A key's scores fold its scales
   in per group: q . k = sum over groups of scale x (q . codes), one FMA a group on top of the products */
#define Q8_SCALES(tok) ((tok) / KV_Q8_GROUP) /* scales per token row */

static inline __attribute__((always_inline)) void score_q8(const float* restrict qg, const int8_t* k0,
                                                           const _Float16* s0, const int64_t tok, const int64_t C,
                                                           float* restrict out, const int N) {
    /* out[0..N-1] = qg . the N key rows from k0 (tok elements apart), their scales from s0 (N = VL: the
       lanes summed by score_vl's transposing tree) */
    V a[VL];
    UNROLL for (int i = 0; i < N; i++) a[i] = vzero();
    for (int64_t g = 0; g < C * VL / KV_Q8_GROUP; g++) {
        UNROLL for (int i = 0; i < N; i++) {
            const int8_t* k = k0 + i * tok + g * KV_Q8_GROUP;
            V dot = vmul(vld(qg + g * KV_Q8_GROUP), vld_i8(k));
            UNROLL for (int e = VL; e < KV_Q8_GROUP; e += VL)
                dot = vfma(vld(qg + g * KV_Q8_GROUP + e), vld_i8(k + e), dot);
            a[i] = vfma(dot, vset1((float)s0[i * Q8_SCALES(tok) + g]), a[i]);
        }
    }
    if (N == VL)
        vst(out, vsum_lanes(a));
    else
        UNROLL for (int i = 0; i < N; i++) out[i] = vsum(a[i]);
}

static inline __attribute__((always_inline)) void score4(const float* restrict qg, const void* k0,
                                                         const int64_t tok, const int64_t C, float* restrict out,
                                                         const int kind) {
    /* out[0..3] = qg . the key rows k0, k0 + tok, k0 + 2 tok, k0 + 3 tok */
    V a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    for (int64_t c = 0; c < C; c++) {
        const V qv = vld(qg + c * VL);
        a0 = vfma(qv, vld_kv(kv_at(k0, c * VL, kind), kind), a0);
        a1 = vfma(qv, vld_kv(kv_at(k0, tok + c * VL, kind), kind), a1);
        a2 = vfma(qv, vld_kv(kv_at(k0, 2 * tok + c * VL, kind), kind), a2);
        a3 = vfma(qv, vld_kv(kv_at(k0, 3 * tok + c * VL, kind), kind), a3);
    }
    vsum4(a0, a1, a2, a3, out);
}

static inline __attribute__((always_inline)) void score_vl(const float* restrict qg, const void* k0,
                                                           const int64_t tok, const int64_t C, float* restrict out,
                                                           const int kind) {
    /* out[0..VL-1] = qg . the VL key rows from k0, tok elements apart: one accumulator a key, their lane sums
       by one transposing tree (score4's four horizontal sums cost 3x the shuffles and adds a key) */
    V a[VL];
    UNROLL for (int i = 0; i < VL; i++) a[i] = vzero();
    for (int64_t c = 0; c < C; c++) {
        const V qv = vld(qg + c * VL);
        UNROLL for (int i = 0; i < VL; i++) a[i] = vfma(qv, vld_kv(kv_at(k0, i * tok + c * VL, kind), kind), a[i]);
    }
    vst(out, vsum_lanes(a));
}

static inline __attribute__((always_inline)) float score1(const float* restrict qg, const void* k0, const int64_t C,
                                                          const int kind) {
    V a = vzero();
    for (int64_t c = 0; c < C; c++) a = vfma(vld(qg + c * VL), vld_kv(kv_at(k0, c * VL, kind), kind), a);
    return vsum(a);
}

static inline float softmax_numerators(float* restrict row, const int64_t L, float* restrict max_out) {
    /* exp(row - max) in place; returns 1 / their sum (applied to the output), the max at max_out */
    const int64_t Lv = L / VL * VL;
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
    *max_out = mx;
    return 1.f / sum;
}

static inline void softcap_row(float* restrict row, const int64_t L, const float cap) {
    /* row <- cap tanh(row / cap): Gemma 2's soft-capped scores. tanh |x| = (1 - e) / (1 + e) with
       e = exp(-2 |x|), which keeps vexp's argument at or below 0, where it is accurate */
    const int64_t Lv = L / VL * VL;
    const V zero = vzero(), one = vset1(1.f);
    for (int64_t l = 0; l < Lv; l += VL) {
        const V x = vld(row + l) * (1.f / cap);
        const V e = vexp(vblend(x < zero, x, -x) * 2.f);
        const V t = (one - e) / (one + e) * cap;
        vst(row + l, vblend(x < zero, -t, t));
    }
    for (int64_t l = Lv; l < L; l++) row[l] = cap * tanhf(row[l] / cap);
}

#define PV_ACC 12 /* accumulators add_pv keeps in registers when it takes several heads */
/* gcc 12 cannot see that add_pv reads only the NH x C accumulators it loaded (both are constant where it is
   inlined) and warns about the rest of acc; initializing all MAX_DV of them would cost stores on every call */
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

static inline __attribute__((always_inline)) void add_pv(const float* restrict p, const int64_t pstride,
                                                         const void* v0, const _Float16* s0, const int64_t n,
                                                         const int64_t tok, const int64_t C, const int NH,
                                                         float* restrict oh, const int kind) {
    /* oh[h] += sum over n value rows (v0, v0 + tok, ...) of p[h pstride + t] * row, for NH query heads of a
       group (outputs C * VL apart): each value vector is loaded once for all of them, and NH x C independent
       FMA chains keep both FMA ports busy (one head's C chains wait on the FMA latency). KV_Q8: the rows'
       scales from s0 */
    V acc[MAX_DV];
    UNROLL for (int h = 0; h < NH; h++)
        UNROLL for (int64_t c = 0; c < C; c++) acc[h * C + c] = vld(oh + (h * C + c) * VL);
    for (int64_t t = 0; t < n; t++) {
        V pt[NH];
        UNROLL for (int h = 0; h < NH; h++) pt[h] = vset1(p[h * pstride + t]);
        UNROLL for (int64_t c = 0; c < C; c++) {
            const V vv = kind == KV_Q8 ? vmul(vld_i8(kv_at(v0, t * tok + c * VL, kind)),
                                              vset1((float)s0[t * Q8_SCALES(tok) + c * VL / KV_Q8_GROUP]))
                                       : vld_kv(kv_at(v0, t * tok + c * VL, kind), kind);
            UNROLL for (int h = 0; h < NH; h++) acc[h * C + c] = vfma(pt[h], vv, acc[h * C + c]);
        }
    }
    UNROLL for (int h = 0; h < NH; h++)
        UNROLL for (int64_t c = 0; c < C; c++) vst(oh + (h * C + c) * VL, acc[h * C + c]);
}

static inline __attribute__((always_inline)) void add_pv_group(const float* restrict p, const int64_t pstride,
                                                               const void* v0, const _Float16* s0, const int64_t n,
                                                               const int64_t tok, const int64_t C, const int64_t G,
                                                               float* restrict oh, const int kind) {
    /* the G query heads of one KV head: three at a time where their accumulators fit in registers */
    int64_t g = 0;
    if (3 * C <= PV_ACC)
        for (; g + 3 <= G; g += 3) add_pv(p + g * pstride, pstride, v0, s0, n, tok, C, 3, oh + g * C * VL, kind);
    if (2 * C <= PV_ACC)
        for (; g + 2 <= G; g += 2) add_pv(p + g * pstride, pstride, v0, s0, n, tok, C, 2, oh + g * C * VL, kind);
    for (; g < G; g++) add_pv(p + g * pstride, pstride, v0, s0, n, tok, C, 1, oh + g * C * VL, kind);
}

static inline void scale_rows(float* restrict o, const float* restrict inv, const int64_t rows, const int64_t C) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < C; c++) vst(o + (r * C + c) * VL, vmul(vld(o + (r * C + c) * VL), vset1(inv[r])));
}

static inline __attribute__((always_inline)) void decode_heads(
    const float* restrict qs, const void* kc, const void* vc, const _Float16* ks, const _Float16* vs,
    const int32_t* restrict table, const int64_t L, float* restrict s, float* restrict os, float* restrict stats,
    const int64_t H, const int64_t G, const int64_t tok, const int64_t D, const int64_t BS, const int64_t stride,
    const float scale, const float softcap, const int kind) {
    /* One work item: H consecutive KV heads of a sequence (kc/vc, and ks/vs for KV_Q8, offset to the first), G
       query heads each, over the L keys from the first of `table`'s blocks. qs, os: those H G query heads
       [H G][D]; s: their score rows [H G][stride]; tok: elements per token row; softcap > 0: scores
       soft-capped before the softmax; stats (a part of a split context): each row's softmax max and sum
       [H G][2] (else NULL) */
    const int64_t C = D / VL, R = H * G, width = H * D, hs = D / KV_Q8_GROUP; /* hs: a head row's scales */
    const int q8 = kind == KV_Q8;
    float q[R * D];
    for (int64_t i = 0; i < R * D; i++) q[i] = qs[i] * scale;
    for (int64_t a = 0; a < PREFETCH_AHEAD && a < L; a += 4) prefetch_4_tokens(kc, table, a, BS, tok, width, kind);
    for (int64_t l0 = 0, j = 0; l0 < L; l0 += BS, j++) {
        const int64_t n = L - l0 < BS ? L - l0 : BS;
        const void* kb = kv_at(kc, (int64_t)table[j] * BS * tok, kind);
        const _Float16* ksb = q8 ? ks + (int64_t)table[j] * BS * Q8_SCALES(tok) : NULL;
        if (q8 && l0 + BS < L) /* the next block's scales, a few lines */
            prefetch_rows(ks + (int64_t)table[j + 1] * BS * Q8_SCALES(tok), 1, 0, BS * Q8_SCALES(tok), KV_F16);
        int64_t t = 0;
        for (; t + VL <= n; t += VL) {
            /* the group's K prefetches, 4 token rows at a time, spread between the heads' scores: issued in
               one burst they stall the core once its fill buffers are taken */
            for (int64_t r = 0, a = 0; r < R || a < VL; r++) {
                if (r < R && q8)
                    score_q8(q + r * D, kv_at(kb, t * tok + (r / G) * D, kind),
                             ksb + t * Q8_SCALES(tok) + (r / G) * hs, tok, C, s + r * stride + l0 + t, VL);
                else if (r < R)
                    score_vl(q + r * D, kv_at(kb, t * tok + (r / G) * D, kind), tok, C, s + r * stride + l0 + t,
                             kind);
                if (a < VL) {
                    const int64_t ahead = l0 + t + a + PREFETCH_AHEAD;
                    if (ahead + 4 <= L) prefetch_4_tokens(kc, table, ahead, BS, tok, width, kind);
                    a += 4;
                }
            }
        }
        for (; t + 4 <= n; t += 4) {
            const int64_t ahead = l0 + t + PREFETCH_AHEAD;
            if (ahead + 4 <= L) prefetch_4_tokens(kc, table, ahead, BS, tok, width, kind);
            for (int64_t r = 0; r < R; r++)
                if (q8)
                    score_q8(q + r * D, kv_at(kb, t * tok + (r / G) * D, kind),
                             ksb + t * Q8_SCALES(tok) + (r / G) * hs, tok, C, s + r * stride + l0 + t, 4);
                else
                    score4(q + r * D, kv_at(kb, t * tok + (r / G) * D, kind), tok, C, s + r * stride + l0 + t,
                           kind);
        }
        for (; t < n; t++)
            for (int64_t r = 0; r < R; r++)
                if (q8)
                    score_q8(q + r * D, kv_at(kb, t * tok + (r / G) * D, kind),
                             ksb + t * Q8_SCALES(tok) + (r / G) * hs, tok, C, s + r * stride + l0 + t, 1);
                else
                    s[r * stride + l0 + t] = score1(q + r * D, kv_at(kb, t * tok + (r / G) * D, kind), C, kind);
    }
    /* during the softmax */
    prefetch_rows(kv_at(vc, (int64_t)table[0] * BS * tok, kind), L < BS ? L : BS, tok, width, kind);
    if (softcap > 0.f)
        for (int64_t r = 0; r < R; r++) softcap_row(s + r * stride, L, softcap);
    float inv[R];
    for (int64_t r = 0; r < R; r++) {
        float mx;
        inv[r] = softmax_numerators(s + r * stride, L, &mx);
        if (stats) stats[2 * r] = mx, stats[2 * r + 1] = 1.f / inv[r];
    }
    for (int64_t i = 0; i < R * D; i++) os[i] = 0.f;
    for (int64_t l0 = 0, j = 0; l0 < L; l0 += BS, j++) {
        const int64_t n = L - l0 < BS ? L - l0 : BS;
        const void* vb = kv_at(vc, (int64_t)table[j] * BS * tok, kind);
        /* V is prefetched in this pass only, a block ahead (the first during the softmax): taken in the score
           pass too, it cost more than it saved (item 40) */
        const void* next = l0 + BS < L ? kv_at(vc, (int64_t)table[j + 1] * BS * tok, kind) : NULL;
        const _Float16* vsb = q8 ? vs + (int64_t)table[j] * BS * Q8_SCALES(tok) : NULL;
        if (q8 && next)
            prefetch_rows(vs + (int64_t)table[j + 1] * BS * Q8_SCALES(tok), 1, 0, BS * Q8_SCALES(tok), KV_F16);
        for (int64_t h = 0; h < H; h++) {
            if (next) /* a share of the rows before each head's products: spread, like the score pass's */
                prefetch_rows(kv_at(next, h * BS / H * tok, kind), (h + 1) * BS / H - h * BS / H, tok, width, kind);
            add_pv_group(s + h * G * stride + l0, stride, kv_at(vb, h * D, kind), q8 ? vsb + h * hs : NULL, n, tok,
                         C, G, os + h * G * D, kind);
        }
    }
    scale_rows(os, inv, R, C);
}

static inline __attribute__((always_inline)) void decode_item(
    const float* restrict qs, const void* kc, const void* vc, const _Float16* ks, const _Float16* vs,
    const int32_t* restrict table, const int64_t L, float* restrict s, float* restrict os, float* restrict stats,
    const int64_t H, const int64_t G, const int64_t tok, const int64_t D, const int64_t BS, const int64_t stride,
    const float scale, const float softcap, const int kind) {
    if (D == 64) /* the common head size, with its loop bounds known to the compiler */
        decode_heads(qs, kc, vc, ks, vs, table, L, s, os, stats, H, G, tok, 64, BS, stride, scale, softcap, kind);
    else
        decode_heads(qs, kc, vc, ks, vs, table, L, s, os, stats, H, G, tok, D, BS, stride, scale, softcap, kind);
}

static int64_t split_parts(const int32_t* seq_lens, const int64_t B, const int64_t items, const int nthreads) {
    /* parts per work item (`items` of them a sequence): enough for every thread, none under SPLIT_MIN_KEYS keys */
    if (B * items >= SEQ_ITEMS_PER_THREAD * nthreads) return 1;
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++) longest = seq_lens[b] > longest ? seq_lens[b] : longest;
    const int64_t want = (SEQ_ITEMS_PER_THREAD * nthreads + B * items - 1) / (B * items);
    const int64_t most = longest / SPLIT_MIN_KEYS;
    return want < most ? want : most > 1 ? most : 1;
}

static void combine_parts(const float* restrict partial, const float* restrict stats, const int64_t rows,
                          const int64_t parts, const int64_t D, float* restrict out) {
    /* out row r = the parts' outputs weighted by each part's softmax sum under the rows' common max */
    for (int64_t r = 0; r < rows; r++) {
        float mx = -INFINITY, total = 0.f;
        for (int64_t p = 0; p < parts; p++) {
            const float* st = stats + 2 * (p * rows + r);
            if (st[1] > 0.f && st[0] > mx) mx = st[0];
        }
        float* o = out + r * D;
        for (int64_t d = 0; d < D; d++) o[d] = 0.f;
        for (int64_t p = 0; p < parts; p++) {
            const float* st = stats + 2 * (p * rows + r);
            if (!(st[1] > 0.f)) continue; /* a part past this sequence's end */
            const float w = st[1] * expf(st[0] - mx);
            const float* po = partial + (p * rows + r) * D;
            for (int64_t d = 0; d < D; d++) o[d] += w * po[d];
            total += w;
        }
        for (int64_t d = 0; d < D; d++) o[d] /= total;
    }
}

/* q, out: [B, Hq, D] float32; k_cache, v_cache: [num_blocks, BS, Hkv, D] of kv_dtype (KV_Q8: and ks, vs their
   float16 scales, one per KV_Q8_GROUP elements; else unused); block_tables: [B, W]
   int32; seq_lens: [B] int32; scores: [B, Hq, stride] scratch, stride >= max seq_len rounded up to 16;
   softcap > 0: scores -> softcap tanh(scores / softcap) (0: none). Contiguous, D % 16 == 0. Returns 0, or -1
   when the split parts' memory could not be had. */
int paged_decode(const float* q, const void* kc, const void* vc, const void* ks, const void* vs,
                 const int32_t kv_dtype, const int32_t* block_tables, const int32_t* seq_lens, float* out,
                 float* scores, const int64_t B, const int64_t Hq, const int64_t Hkv, const int64_t D,
                 const int64_t BS, const int64_t W, const int64_t stride, const float scale, const float softcap,
                 const int nthreads) {
    const int64_t G = Hq / Hkv, tok = Hkv * D;
    /* KV heads an item: all of a sequence's once there are enough sequences, else one */
    const int fits = Hq * D <= MAX_SEQ_QUERY_FLOATS;
    int64_t H = B >= SEQ_ITEMS_PER_THREAD * nthreads && fits ? Hkv : 1;
    int64_t parts = split_parts(seq_lens, B, Hkv / H, nthreads);
    if (parts > 1 && fits) { /* a split context: parts of all its KV heads read whole blocks (10-25% faster) */
        H = Hkv;
        parts = split_parts(seq_lens, B, 1, nthreads);
    }
    const int64_t items = Hkv / H;
    /* parts > 1: each part's outputs [parts][B Hq][D], then its rows' softmax max and sum [parts][B Hq][2] */
    float* partial = parts > 1 ? malloc(sizeof(float) * parts * B * Hq * (D + 2)) : NULL;
    if (parts > 1 && partial == NULL) return -1;
    float* stats = partial ? partial + parts * B * Hq * D : NULL;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) /* lengths differ: balance */
    for (int64_t i = 0; i < B * items * parts; i++) {
        const int64_t p = i % parts, b = i / parts / items, h = i / parts % items * H, row = b * Hq + h * G;
        /* this part's keys: [first, first + n), first a multiple of BS */
        const int64_t per = (seq_lens[b] + parts - 1) / parts, span = (per + BS - 1) / BS * BS;
        const int64_t first = p * span, n = seq_lens[b] - first < span ? seq_lens[b] - first : span;
        float* st = stats ? stats + 2 * (p * B * Hq + row) : NULL;
        if (n <= 0) { /* past this sequence's end: weighs nothing in the combine */
            for (int64_t r = 0; r < H * G; r++) st[2 * r] = -INFINITY, st[2 * r + 1] = 0.f;
            continue;
        }
        float* o = partial ? partial + (p * B * Hq + row) * D : out + row * D;
        const int32_t* table = block_tables + b * W + first / BS;
        float* s = scores + row * stride + first;
        const float* qs = q + row * D;
        if (kv_dtype == KV_BF16)
            decode_item(qs, kv_at(kc, h * D, KV_BF16), kv_at(vc, h * D, KV_BF16), NULL, NULL, table, n, s, o, st,
                        H, G, tok, D, BS, stride, scale, softcap, KV_BF16);
        else if (kv_dtype == KV_F16)
            decode_item(qs, kv_at(kc, h * D, KV_F16), kv_at(vc, h * D, KV_F16), NULL, NULL, table, n, s, o, st,
                        H, G, tok, D, BS, stride, scale, softcap, KV_F16);
        else if (kv_dtype == KV_Q8)
            decode_item(qs, kv_at(kc, h * D, KV_Q8), kv_at(vc, h * D, KV_Q8),
                        (const _Float16*)ks + h * D / KV_Q8_GROUP, (const _Float16*)vs + h * D / KV_Q8_GROUP, table,
                        n, s, o, st, H, G, tok, D, BS, stride, scale, softcap, KV_Q8);
        else
            decode_item(qs, kv_at(kc, h * D, KV_F32), kv_at(vc, h * D, KV_F32), NULL, NULL, table, n, s, o, st,
                        H, G, tok, D, BS, stride, scale, softcap, KV_F32);
    }
    if (partial) {
        combine_parts(partial, stats, B * Hq, parts, D, out);
        free(partial);
    }
    return 0;
}

/* n floats (whole KV_Q8_GROUPs) into KV_Q8 codes and their groups' scales as llama.cpp's q8_0: scale = the
   group's largest magnitude / 127 (stored in float16), code = x / scale rounded to nearest even as torch's
   round (the torch path writes the same cache: tgi_llm/kv_cache.py) */
static void q8_store_row(int8_t* restrict codes, _Float16* restrict scales, const float* restrict src,
                         const int64_t n) {
    for (int64_t g = 0; g < n / KV_Q8_GROUP; g++) {
        const float* x = src + g * KV_Q8_GROUP;
        float amax = 0.f;
        for (int i = 0; i < KV_Q8_GROUP; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        scales[g] = (_Float16)d;
        for (int i = 0; i < KV_Q8_GROUP; i++) {
            const float c = nearbyintf(x[i] * id);
            codes[g * KV_Q8_GROUP + i] = (int8_t)(c > 127.f ? 127.f : c < -127.f ? -127.f : c);
        }
    }
}

/* One row of n floats into a cache row of kv_dtype, rounded to nearest even as torch's casts round (the
   torch path writes the same cache); KV_Q8: its scales at `scales` */
void kv_store_row(void* dst, void* scales, const float* src, const int64_t n, const int32_t kv_dtype) {
    if (kv_dtype == KV_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (kv_dtype == KV_BF16) {
        uint16_t* d = dst;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, src + i, sizeof u);
            d[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)(u >> 16 | 0x40) /* NaN stays NaN */
                                                   : (uint16_t)((u + 0x7fffu + (u >> 16 & 1u)) >> 16);
        }
    } else if (kv_dtype == KV_F16) {
        _Float16* d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = (_Float16)src[i];
    } else {
        q8_store_row(dst, scales, src, n);
    }
}

/* paged_prefill_f32 (or a bfloat16 variant, `run`) over a 16- or 8-bit cache: the blocks the sequences read, each
   sequence's as consecutive blocks of a float32 scratch cache, then `run` over that through tables to match.
   The conversion reads each key once a call; the kernel reads it once a query tile. Returns `run`'s result,
   or -1 when the scratch could not be had. */
int paged_prefill_kv(prefill_fn run, const int32_t kv_dtype, const float* q, const int64_t qs, float* out,
                     const void* kc, const void* vc, const void* ks, const void* vs, const int32_t* tables,
                     const int64_t W, const int64_t* trow,
                     const int64_t* qstart, const int64_t* qlen, const int64_t* klen, const int64_t S,
                     const int64_t Hq, const int64_t Hkv, const int64_t D, const int64_t BS, const float scale,
                     const int nthreads) {
    if (kv_dtype == KV_F32)
        return run(q, qs, out, kc, vc, tables, W, trow, qstart, qlen, klen, S, Hq, Hkv, D, BS, scale, nthreads);
    const int64_t block = BS * Hkv * D; /* elements */
    int64_t blocks = 0, width = 0;
    for (int64_t s = 0; s < S; s++) {
        const int64_t n = (klen[s] + BS - 1) / BS;
        blocks += n;
        width = n > width ? n : width;
    }
    float* k32 = malloc(sizeof(float) * blocks * block);
    float* v32 = malloc(sizeof(float) * blocks * block);
    int32_t* t32 = malloc(sizeof(int32_t) * (S * width + blocks)); /* the new tables, then each block's source */
    int64_t* rows = malloc(sizeof(int64_t) * S);
    int rc = -1;
    if (k32 && v32 && t32 && rows) {
        int32_t* source = t32 + S * width;
        for (int64_t s = 0, next = 0; s < S; s++) {
            rows[s] = s;
            for (int64_t j = 0; j < (klen[s] + BS - 1) / BS; j++, next++) {
                t32[s * width + j] = (int32_t)next;
                source[next] = tables[trow[s] * W + j];
            }
        }
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t i = 0; i < blocks; i++) {
            const int64_t from = (int64_t)source[i] * block;
            if (kv_dtype == KV_Q8) {
                const int64_t tok = Hkv * D, g = from / KV_Q8_GROUP;
                dequant_q8_rows(kv_at(kc, from, KV_Q8), (const _Float16*)ks + g, BS, tok, tok, k32 + i * block);
                dequant_q8_rows(kv_at(vc, from, KV_Q8), (const _Float16*)vs + g, BS, tok, tok, v32 + i * block);
                continue;
            }
            for (int64_t e = 0; e < block; e += VL) {
                if (kv_dtype == KV_BF16) {
                    vst(k32 + i * block + e, vld_bf16(kv_at(kc, from + e, KV_BF16)));
                    vst(v32 + i * block + e, vld_bf16(kv_at(vc, from + e, KV_BF16)));
                } else {
                    vst(k32 + i * block + e, vld_f16(kv_at(kc, from + e, KV_F16)));
                    vst(v32 + i * block + e, vld_f16(kv_at(vc, from + e, KV_F16)));
                }
            }
        }
        rc = run(q, qs, out, k32, v32, t32, width, rows, qstart, qlen, klen, S, Hq, Hkv, D, BS, scale, nthreads);
    }
    free(k32);
    free(v32);
    free(t32);
    free(rows);
    return rc;
}

/* ---- prefill: causal attention of prompt chunks over their context, K/V read in place (flash style) ----
   One work item per (sequence, query tile, KV head): a tile's rows are up to MAXQ (token, query head of the
   group) pairs, held transposed ([D][rows]) so that the online softmax runs down the lanes. A key's scores
   for VL rows are one vector (its d-th element broadcast against the rows' d-th elements), so the row
   maxima, sums and rescales are lane-wise with no horizontal reductions, and the keys are read in place
   from the cache, never transposed. Then p . v with RP rows x CB vectors of D in registers. */

#define KT 16 /* keys per tile */
#define MAXQ 48 /* rows per work item: a multiple of VL */
#if VL == 16
#define TK 8 /* keys x row vectors per score register block: 8 x 3 accumulators */
#define RB 3
#define RP 4
#else
#define TK 4
#define RB 3
#define RP 2
#endif
#define CB 4
/* The running max of a row moves only when a score passes it by this much (lazy rescaling), so the
   accumulators are rarely rescaled and exp(x - max) stays below e^8. Numerators and sum share the max: the
   result is the same up to rounding. */
#define RESCALE_MARGIN 8.0f

static inline int64_t ceil_div(const int64_t a, const int64_t b) { return (a + b - 1) / b; }

static inline const float* key_row(const float* base, const int32_t* table, int64_t j, int64_t BS, int64_t tok) {
    return base + ((int64_t)table[j / BS] * BS + j % BS) * tok;
}

static inline int vany(VI m) {
#if defined(__AVX512F__)
    return _mm512_test_epi32_mask((__m512i)m, (__m512i)m) != 0;
#elif defined(__AVX2__) && defined(__FMA__)
    return _mm256_movemask_ps((__m256)m) != 0;
#else
    for (int i = 0; i < VL; i++)
        if (m[i]) return 1;
    return 0;
#endif
}

/* pt[t][n0 * VL ...] = the scores of keys t0 .. t0 + TK - 1 for R row vectors from n0 (R: a constant once
   inlined, so the accumulators stay in registers) */
static inline __attribute__((always_inline)) void score_block(const float* restrict qt, const int64_t NRV,
                                                              const float* const* krow, const int64_t D,
                                                              float* restrict pt, const int64_t n0, const int R) {
    V s[TK][RB];
    UNROLL for (int t = 0; t < TK; t++) UNROLL for (int r = 0; r < RB; r++) s[t][r] = vzero();
    for (int64_t d = 0; d < D; d++) {
        V qv[RB];
        UNROLL for (int r = 0; r < RB; r++) if (r < R) qv[r] = vld(qt + d * NRV + (n0 + r) * VL);
        UNROLL for (int t = 0; t < TK; t++) {
            const V kb = vset1(krow[t][d]);
            UNROLL for (int r = 0; r < RB; r++) if (r < R) s[t][r] = vfma(qv[r], kb, s[t][r]);
        }
    }
    UNROLL for (int t = 0; t < TK; t++)
        UNROLL for (int r = 0; r < RB; r++) if (r < R) vst(pt + t * NRV + (n0 + r) * VL, s[t][r]);
}

static inline void init_rows(VI* lastv, V* mx, V* l, float* restrict acc, const int64_t NR, const int64_t NQ,
                             const int64_t G, const int64_t first, const int64_t end, const int64_t D) {
    /* an item's NR row vectors before its first key tile: row r's last visible key is its token's position
       (first + r / G; padding rows see every key), no max yet, nothing summed */
    int32_t last[MAXQ];
    for (int64_t r = 0; r < NR * VL; r++) last[r] = (int32_t)(r < NQ ? first + r / G : end - 1);
    memset(acc, 0, NR * VL * D * sizeof(float));
    for (int64_t n = 0; n < NR; n++) {
        mx[n] = vset1(-INFINITY);
        l[n] = vzero();
        memcpy(&lastv[n], last + n * VL, sizeof(VI));
    }
}

static inline __attribute__((always_inline)) void tile_softmax(
    float* restrict pt, const int64_t NRV, const int64_t NR, const int64_t keys, const int masked, const int64_t j0,
    const VI* lastv, V* mx, V* l, float* restrict acc, const int64_t D, const int acc_transposed) {
    /* One key tile's scores pt [keys][NRV] -> softmax numerators under the rows' running max (masked: some key
       of the tile is in some row's future, -inf there), the running sums l updated, acc rescaled where a
       row's max moved: acc is the output [NRV][D], or its transpose O^T [D][NRV] (the AMX kernel's) */
    for (int64_t n = 0; n < NR; n++) {
        float* p = pt + n * VL;
        if (masked)
            for (int64_t t = 0; t < keys; t++) {
                const VI future = ((VI){0} + (int32_t)(j0 + t)) > lastv[n];
                vst(p + t * NRV, vblend(future, vset1(-INFINITY), vld(p + t * NRV)));
            }
        V tmax = vld(p);
        for (int64_t t = 1; t < keys; t++) tmax = vmax(tmax, vld(p + t * NRV));
        const VI up = tmax > mx[n] + vset1(RESCALE_MARGIN);
        if (vany(up)) { /* rescale what was summed under the old max, in the rows whose max moves */
            const V moved = vblend(up, tmax, mx[n]);
            const V corr = vblend(mx[n] > vset1(-INFINITY), vexp(mx[n] - moved), vzero());
            l[n] = vmul(l[n], corr);
            if (acc_transposed)
                for (int64_t d = 0; d < D; d++) vst(acc + d * NRV + n * VL, vmul(vld(acc + d * NRV + n * VL), corr));
            else {
                float c[VL];
                vst(c, corr);
                for (int64_t i = 0; i < VL; i++)
                    if (c[i] != 1.f) {
                        float* a = acc + (n * VL + i) * D;
                        for (int64_t d = 0; d < D; d += VL) vst(a + d, vmul(vld(a + d), vset1(c[i])));
                    }
            }
            mx[n] = moved;
        }
        const V mb = mx[n];
        V sum = l[n];
        for (int64_t t = 0; t < keys; t++) {
            const V x = vld(p + t * NRV);
            const V e = vblend(x > vset1(-INFINITY), vexp(x - mb), vzero()); /* masked keys weigh 0 */
            vst(p + t * NRV, e);
            sum = vadd(sum, e);
        }
        l[n] = sum;
    }
}

static inline void write_rows(float* restrict out, const float* restrict acc, const V* l, const int64_t NR,
                              const int64_t NQ, const int64_t i0, const int64_t G, const int64_t Hq, const int64_t h,
                              const int64_t D) {
    /* out rows of the item's NQ query rows: acc / the softmax sums */
    float lsum[MAXQ];
    for (int64_t n = 0; n < NR; n++) vst(lsum + n * VL, l[n]);
    for (int64_t r = 0; r < NQ; r++) {
        const V inv = vset1(1.f / lsum[r]);
        float* o = out + ((i0 + r / G) * Hq + h * G + r % G) * D;
        for (int64_t c = 0; c < D; c += VL) vst(o + c, vmul(vld(acc + r * D + c), inv));
    }
}

static void prefill_item(const float* restrict q, const int64_t qs, float* restrict out, const float* kc,
                         const float* vc, const int32_t* restrict table, const int64_t BS, const int64_t tok,
                         const int64_t h, const int64_t G, const int64_t Hq, const int64_t D, const int64_t i0,
                         const int64_t m, const int64_t off, const float scale,
                         float* restrict qt, float* restrict acc, float* restrict pt) {
    /* queries: tokens i0 .. i0 + m - 1 of the chunk (context positions off + i0 ...), heads h*G .. h*G+G-1;
       row r = token (r / G), head (r % G); rows past NQ (padding) see every key with a zero query */
    const int64_t NQ = m * G, NR = ceil_div(NQ, VL), NRV = NR * VL, end = off + i0 + m;
    for (int64_t r = 0; r < NRV; r++) {
        if (r < NQ) {
            const float* src = q + (i0 + r / G) * qs + (h * G + r % G) * D;
            for (int64_t d = 0; d < D; d++) qt[d * NRV + r] = src[d] * scale;
        } else {
            for (int64_t d = 0; d < D; d++) qt[d * NRV + r] = 0.f;
        }
    }
    V mx[MAXQ / VL], l[MAXQ / VL];
    VI lastv[MAXQ / VL];
    init_rows(lastv, mx, l, acc, NR, NQ, G, off + i0, end, D);
    const float* krow[KT];
    const float* vrow[KT];
    for (int64_t j0 = 0; j0 < end; j0 += KT) {
        const int64_t nk = end - j0 < KT ? end - j0 : KT;
        for (int64_t t = 0; t < KT; t++) { /* keys past the end: any valid row, masked below */
            const int64_t j = j0 + (t < nk ? t : nk - 1);
            krow[t] = key_row(kc, table, j, BS, tok) + h * D;
            vrow[t] = key_row(vc, table, j, BS, tok) + h * D;
        }
        for (int64_t t0 = 0; t0 < KT; t0 += TK)
            for (int64_t n0 = 0; n0 < NR; n0 += RB) {
                const int64_t R = NR - n0 < RB ? NR - n0 : RB;
                if (R == RB)
                    score_block(qt, NRV, krow + t0, D, pt + t0 * NRV, n0, RB);
#if RB > 2
                else if (R == 2)
                    score_block(qt, NRV, krow + t0, D, pt + t0 * NRV, n0, 2);
#endif
                else
                    score_block(qt, NRV, krow + t0, D, pt + t0 * NRV, n0, 1);
            }
        tile_softmax(pt, NRV, NR, KT, j0 + KT - 1 > off + i0, j0, lastv, mx, l, acc, D, 0);
        for (int64_t r0 = 0; r0 < NRV; r0 += RP) {
            int64_t c0 = 0;
            for (; c0 + CB * VL <= D; c0 += CB * VL) {
                V a[RP][CB];
                UNROLL for (int r = 0; r < RP; r++)
                    UNROLL for (int c = 0; c < CB; c++) a[r][c] = vld(acc + (r0 + r) * D + c0 + c * VL);
                for (int64_t t = 0; t < nk; t++) {
                    V vv[CB];
                    UNROLL for (int c = 0; c < CB; c++) vv[c] = vld(vrow[t] + c0 + c * VL);
                    UNROLL for (int r = 0; r < RP; r++) {
                        const V pb = vset1(pt[t * NRV + r0 + r]);
                        UNROLL for (int c = 0; c < CB; c++) a[r][c] = vfma(pb, vv[c], a[r][c]);
                    }
                }
                UNROLL for (int r = 0; r < RP; r++)
                    UNROLL for (int c = 0; c < CB; c++) vst(acc + (r0 + r) * D + c0 + c * VL, a[r][c]);
            }
            for (; c0 < D; c0 += VL) /* head sizes that are not a multiple of CB vectors */
                for (int r = 0; r < RP; r++) {
                    V a = vld(acc + (r0 + r) * D + c0);
                    for (int64_t t = 0; t < nk; t++) a = vfma(vset1(pt[t * NRV + r0 + r]), vld(vrow[t] + c0), a);
                    vst(acc + (r0 + r) * D + c0, a);
                }
        }
    }
    write_rows(out, acc, l, NR, NQ, i0, G, Hq, h, D);
}

/* Sequence s: its queries are rows qstart[s] .. qstart[s] + qlen[s] - 1 of q (row stride qs) and of out
   ([T, Hq, D] contiguous), the last qlen[s] positions of its klen[s]-token context, whose K/V (new tokens
   included) are in the paged cache ([blocks, BS, Hkv, D]) through block table row tables + trow[s] * W.
   Work items: (sequence, query tile, kv head), the latest tiles (the most keys) first so the dynamic
   schedule ends balanced. Returns 0, or -1 when a thread's scratch could not be allocated. */
int paged_prefill_f32(const float* q, int64_t qs, float* out, const float* kc, const float* vc,
                      const int32_t* tables, int64_t W, const int64_t* trow, const int64_t* qstart,
                      const int64_t* qlen, const int64_t* klen, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                      int64_t BS, float scale, int nthreads) {

    const int64_t G = Hq / Hkv, MT = MAXQ / G, tok = Hkv * D; /* MT: tokens per tile (G <= MAXQ) */
    int64_t items = 0;
    for (int64_t s = 0; s < S; s++) items += Hkv * ceil_div(qlen[s], MT);
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float* scratch = malloc(sizeof(float) * (2 * MAXQ * D + MAXQ * KT));
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (scratch == NULL) continue;
            int64_t rest = it, s = 0;
            while (rest >= Hkv * ceil_div(qlen[s], MT)) rest -= Hkv * ceil_div(qlen[s++], MT);
            const int64_t tile = ceil_div(qlen[s], MT) - 1 - rest / Hkv, h = rest % Hkv;
            const int64_t i0 = tile * MT, m = qlen[s] - i0 < MT ? qlen[s] - i0 : MT;
            float *qt = scratch, *acc = qt + MAXQ * D, *pt = acc + MAXQ * D;
            const float* qq = q + qstart[s] * qs;
            float* oo = out + qstart[s] * Hq * D;
            const int32_t* table = tables + trow[s] * W;
            if (D == 64)
                prefill_item(qq, qs, oo, kc, vc, table, BS, tok, h, G, Hq, 64, i0, m, klen[s] - qlen[s], scale,
                             qt, acc, pt);
            else
                prefill_item(qq, qs, oo, kc, vc, table, BS, tok, h, G, Hq, D, i0, m, klen[s] - qlen[s], scale,
                             qt, acc, pt);
        }
        free(scratch);
    }
    return failed ? -1 : 0;
}

/* ---- prefill with bfloat16 products (AVX512-BF16 only) ----
   The same work items, key tiles and online softmax as paged_prefill_f32, with q . k and p . v through
   vdpbf16ps (two products of bfloat16 operands per float lane per instruction, summed in float32). For
   models whose linears already round their activations to bfloat16 (--dtype bfloat16 on the CPU);
   everything else keeps the float32 kernel, and so does every CPU without these instructions (emulated
   they would be slower than float32). Each call first rounds its sequences' K and V to bfloat16 once, for
   all the query tiles that read them: K rows as they are (a key's dims pair up as vdpbf16ps reads them), V
   with two keys' rows interleaved (p . v sums over keys). Scores, softmax and the output stay float32. */
#if defined(__AVX512BF16__) && VL == 16
int has_bf16_prefill(void) { return 1; }

static inline void bf16_row(const float* restrict x, const float scale, const int64_t D, uint16_t* restrict out) {
    for (int64_t c = 0; c < D; c += VL)
        _mm256_storeu_si256((__m256i*)(out + c), (__m256i)_mm512_cvtneps_pbh(vmul(vld(x + c), vset1(scale))));
}

static void convert_kv_tile(const float* kc, const float* vc, const int32_t* table, const int64_t BS,
                            const int64_t tok, const int64_t h, const int64_t D, const int64_t j0, const int64_t n,
                            uint16_t* restrict kb, uint32_t* restrict vb) {
    /* keys j0 .. j0 + n - 1 of one KV head into a tile of KT: K rows at kb ([KT][D] bfloat16), V key pairs at
       vb ([KT / 2][D] words); rows past n are zeros (their scores are masked, their weights 0) */
    const V zero = vzero();
    for (int64_t t = 0; t < KT; t++) {
        if (t < n) bf16_row(key_row(kc, table, j0 + t, BS, tok) + h * D, 1.f, D, kb + t * D);
        else memset(kb + t * D, 0, D * sizeof(uint16_t));
    }
    for (int64_t t = 0; t < KT; t += 2) {
        const float* a = t < n ? key_row(vc, table, j0 + t, BS, tok) + h * D : NULL;
        const float* b = t + 1 < n ? key_row(vc, table, j0 + t + 1, BS, tok) + h * D : NULL;
        for (int64_t c = 0; c < D; c += VL)
            _mm512_storeu_si512(vb + t / 2 * D + c, pair_words(a ? vld(a + c) : zero, b ? vld(b + c) : zero));
    }
}

static inline __attribute__((always_inline)) void score_block_bf16(const uint32_t* restrict qt, const int64_t NRV,
                                                                   const uint32_t* const* krow, const int64_t D2,
                                                                   float* restrict pt, const int64_t n0, const int R) {
    /* score_block with bfloat16 pairs: qt [D / 2][NRV] and the key rows as dim pairs */
    V s[TK][RB];
    UNROLL for (int t = 0; t < TK; t++) UNROLL for (int r = 0; r < RB; r++) s[t][r] = vzero();
    for (int64_t d = 0; d < D2; d++) {
        __m512i qv[RB];
        UNROLL for (int r = 0; r < RB; r++) if (r < R) qv[r] = _mm512_loadu_si512(qt + d * NRV + (n0 + r) * VL);
        UNROLL for (int t = 0; t < TK; t++) {
            const __m512i kb = _mm512_set1_epi32((int)krow[t][d]);
            UNROLL for (int r = 0; r < RB; r++)
                if (r < R) s[t][r] = _mm512_dpbf16_ps(s[t][r], (__m512bh)qv[r], (__m512bh)kb);
        }
    }
    UNROLL for (int t = 0; t < TK; t++)
        UNROLL for (int r = 0; r < RB; r++) if (r < R) vst(pt + t * NRV + (n0 + r) * VL, s[t][r]);
}

static void prefill_item_bf16(const float* restrict q, const int64_t qs, float* restrict out,
                              const uint16_t* restrict kb, const uint32_t* restrict vb, const int64_t h,
                              const int64_t G, const int64_t Hq, const int64_t D, const int64_t i0, const int64_t m,
                              const int64_t off, const float scale, uint32_t* restrict qt, float* restrict acc,
                              float* restrict pt, uint32_t* restrict pp) {
    /* prefill_item over the call's bfloat16 K (kb: [keys][D]) and V pairs (vb: [keys / 2][D]) of head h */
    const int64_t NQ = m * G, NR = ceil_div(NQ, VL), NRV = NR * VL, end = off + i0 + m, D2 = D / 2;
    uint32_t row[128]; /* one query row in bfloat16, D <= 256 */
    for (int64_t r = 0; r < NRV; r++) {
        if (r < NQ) bf16_row(q + (i0 + r / G) * qs + (h * G + r % G) * D, scale, D, (uint16_t*)row);
        else memset(row, 0, D * sizeof(uint16_t));
        for (int64_t d = 0; d < D2; d++) qt[d * NRV + r] = row[d];
    }
    V mx[MAXQ / VL], l[MAXQ / VL];
    VI lastv[MAXQ / VL];
    init_rows(lastv, mx, l, acc, NR, NQ, G, off + i0, end, D);
    const uint32_t* krow[KT];
    for (int64_t j0 = 0; j0 < end; j0 += KT) {
        const int64_t nk = end - j0 < KT ? end - j0 : KT, np = (nk + 1) / 2;
        for (int64_t t = 0; t < KT; t++) krow[t] = (const uint32_t*)(kb + (j0 + t) * D);
        for (int64_t t0 = 0; t0 < KT; t0 += TK)
            for (int64_t n0 = 0; n0 < NR; n0 += RB) {
                const int64_t R = NR - n0 < RB ? NR - n0 : RB;
                if (R == RB) score_block_bf16(qt, NRV, krow + t0, D2, pt + t0 * NRV, n0, RB);
                else if (R == 2) score_block_bf16(qt, NRV, krow + t0, D2, pt + t0 * NRV, n0, 2);
                else score_block_bf16(qt, NRV, krow + t0, D2, pt + t0 * NRV, n0, 1);
            }
        tile_softmax(pt, NRV, NR, KT, j0 + KT - 1 > off + i0, j0, lastv, mx, l, acc, D, 0);
        for (int64_t t = 0; t < np; t++) /* the weights of key pairs, as vdpbf16ps reads them */
            for (int64_t n = 0; n < NR; n++)
                _mm512_storeu_si512(pp + t * NRV + n * VL, pair_words(vld(pt + 2 * t * NRV + n * VL),
                                                                      vld(pt + (2 * t + 1) * NRV + n * VL)));
        const uint32_t* vt = vb + j0 / 2 * D;
        for (int64_t r0 = 0; r0 < NRV; r0 += RP) {
            int64_t c0 = 0;
            for (; c0 + CB * VL <= D; c0 += CB * VL) {
                V a[RP][CB];
                UNROLL for (int r = 0; r < RP; r++)
                    UNROLL for (int c = 0; c < CB; c++) a[r][c] = vld(acc + (r0 + r) * D + c0 + c * VL);
                for (int64_t t = 0; t < np; t++) {
                    __m512i vv[CB];
                    UNROLL for (int c = 0; c < CB; c++) vv[c] = _mm512_loadu_si512(vt + t * D + c0 + c * VL);
                    UNROLL for (int r = 0; r < RP; r++) {
                        const __m512i pb = _mm512_set1_epi32((int)pp[t * NRV + r0 + r]);
                        UNROLL for (int c = 0; c < CB; c++)
                            a[r][c] = _mm512_dpbf16_ps(a[r][c], (__m512bh)pb, (__m512bh)vv[c]);
                    }
                }
                UNROLL for (int r = 0; r < RP; r++)
                    UNROLL for (int c = 0; c < CB; c++) vst(acc + (r0 + r) * D + c0 + c * VL, a[r][c]);
            }
            for (; c0 < D; c0 += VL) /* head sizes that are not a multiple of CB vectors */
                for (int r = 0; r < RP; r++) {
                    V a = vld(acc + (r0 + r) * D + c0);
                    for (int64_t t = 0; t < np; t++)
                        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_set1_epi32((int)pp[t * NRV + r0 + r]),
                                             (__m512bh)_mm512_loadu_si512(vt + t * D + c0));
                    vst(acc + (r0 + r) * D + c0, a);
                }
        }
    }
    write_rows(out, acc, l, NR, NQ, i0, G, Hq, h, D);
}

/* ---- prefill with bfloat16 products on AMX tiles ----
   Where the CPU has AMX-BF16, the same work items with both products on the tile unit (TDPBF16PS: a
   16 x 32 by 32 x 16 bfloat16 product into 16 x 16 float32 sums), in the transposed shapes the kernel above
   already keeps its rows in: S^T = K . Q^T (A: 16 keys' rows as they are, B: the item's queries as dim
   pairs, qt [D / 2][rows]; out: scores [keys][rows], pt's layout), the same lane-wise online softmax over
   32 keys, then O^T += V^T . P^T (A: 16 dims of V^T over 32 keys, B: the weights of key pairs, pp
   [keys / 2][rows]), O^T [D][rows] kept in memory and rescaled lane-wise when a row's max moves. Each call
   rounds its sequences' K rows and V^T to bfloat16 once, keys padded with zeros to 32. Same products,
   float32 sums (in another order), same softmax as paged_prefill_bf16. */
#ifdef HAVE_AMX
#define AKT 32 /* keys per block */

static int amx_on = 1; /* set_amx_prefill: TGI_LLM_AMX */
int has_amx_prefill(void) { return amx_granted(); }
void set_amx_prefill(int on) { amx_on = on; }

/* keys j0 .. j0 + n - 1 of KV head h (n <= AKT): K rows into kb ([AKT][D] bfloat16), V transposed into vt
   ([D][kpad] bfloat16, columns j0 ..); keys past n zero */
static void convert_kv_block_amx(const float* kc, const float* vc, const int32_t* table, const int64_t BS,
                                 const int64_t tok, const int64_t h, const int64_t D, const int64_t j0,
                                 const int64_t n, const int64_t kpad, uint16_t* restrict kb, uint16_t* restrict vt) {
    for (int64_t t = 0; t < AKT; t++) {
        if (t < n) bf16_row(key_row(kc, table, j0 + t, BS, tok) + h * D, 1.f, D, kb + t * D);
        else memset(kb + t * D, 0, D * sizeof(uint16_t));
    }
    uint16_t col[AKT][256];
    for (int64_t t = 0; t < AKT; t++) {
        if (t < n) bf16_row(key_row(vc, table, j0 + t, BS, tok) + h * D, 1.f, D, col[t]);
        else memset(col[t], 0, D * sizeof(uint16_t));
    }
    for (int64_t d = 0; d < D; d++)
        for (int64_t t = 0; t < AKT; t++) vt[d * kpad + j0 + t] = col[t][d];
}

static void prefill_item_amx(const float* restrict q, const int64_t qs, float* restrict out,
                             const uint16_t* restrict kb, const uint16_t* restrict vt, const int64_t kpad,
                             const int64_t h, const int64_t G, const int64_t Hq, const int64_t D, const int64_t i0,
                             const int64_t m, const int64_t off, const float scale, uint32_t* restrict qt,
                             float* restrict acc, float* restrict pt, uint32_t* restrict pp) {
    /* prefill_item_bf16 on tiles: kb [kpad][D] and vt [D][kpad] of head h; acc is O^T [D][NRV] */
    const int64_t NQ = m * G, NR = ceil_div(NQ, VL), NRV = NR * VL, end = off + i0 + m, D2 = D / 2;
    uint32_t row[128];
    for (int64_t r = 0; r < NRV; r++) {
        if (r < NQ) bf16_row(q + (i0 + r / G) * qs + (h * G + r % G) * D, scale, D, (uint16_t*)row);
        else memset(row, 0, D * sizeof(uint16_t));
        for (int64_t d = 0; d < D2; d++) qt[d * NRV + r] = row[d];
    }
    V mx[MAXQ / VL], l[MAXQ / VL];
    VI lastv[MAXQ / VL];
    init_rows(lastv, mx, l, acc, NR, NQ, G, off + i0, end, D); /* acc: D x NRV floats either way */
    for (int64_t j0 = 0; j0 < end; j0 += AKT) {
        for (int64_t n = 0; n < NR; n++)
            for (int64_t half = 0; half < AKT / 16; half++) { /* S^T [16 keys][16 rows] = K . Q^T over D */
                _tile_zero(0);
                for (int64_t d0 = 0; d0 < D; d0 += 32) {
                    _tile_loadd(1, kb + (j0 + half * 16) * D + d0, D * 2);
                    _tile_loadd(2, qt + d0 / 2 * NRV + n * VL, NRV * 4);
                    _tile_dpbf16ps(0, 1, 2);
                }
                _tile_stored(0, pt + half * 16 * NRV + n * VL, NRV * 4);
            }
        tile_softmax(pt, NRV, NR, AKT, j0 + AKT - 1 > off + i0, j0, lastv, mx, l, acc, D, 1);
        for (int64_t t = 0; t < AKT / 2; t++) /* the weights of key pairs */
            for (int64_t n = 0; n < NR; n++)
                _mm512_storeu_si512(pp + t * NRV + n * VL, pair_words(vld(pt + 2 * t * NRV + n * VL),
                                                                      vld(pt + (2 * t + 1) * NRV + n * VL)));
        for (int64_t n = 0; n < NR; n++) { /* O^T [16 dims][16 rows] += V^T . P^T */
            _tile_loadd(2, pp + n * VL, NRV * 4);
            for (int64_t d0 = 0; d0 < D; d0 += 16) {
                _tile_loadd(0, acc + d0 * NRV + n * VL, NRV * 4);
                _tile_loadd(1, vt + d0 * kpad + j0, kpad * 2);
                _tile_dpbf16ps(0, 1, 2);
                _tile_stored(0, acc + d0 * NRV + n * VL, NRV * 4);
            }
        }
    }
    float lsum[MAXQ];
    for (int64_t n = 0; n < NR; n++) vst(lsum + n * VL, l[n]);
    for (int64_t r = 0; r < NQ; r++) {
        const float inv = 1.f / lsum[r];
        float* o = out + ((i0 + r / G) * Hq + h * G + r % G) * D;
        for (int64_t d = 0; d < D; d++) o[d] = acc[d * NRV + r] * inv;
    }
}
#else
int has_amx_prefill(void) { return 0; }
void set_amx_prefill(int on) { (void)on; }
#endif

/* The work items of paged_prefill_f32 with bfloat16 products: on AMX tiles (`amx`, keys in blocks of AKT,
   V^T) or AVX512-BF16 (KT, V as key pairs). Each call rounds its sequences' K and V to bfloat16 once, for
   all the query tiles that read them. Returns 0, or -1 when memory for them or a thread's scratch could
   not be allocated. */
static int bf16_prefill_run(const int amx, const float* q, int64_t qs, float* out, const float* kc,
                            const float* vc, const int32_t* tables, int64_t W, const int64_t* trow,
                            const int64_t* qstart, const int64_t* qlen, const int64_t* klen, int64_t S, int64_t Hq,
                            int64_t Hkv, int64_t D, int64_t BS, float scale, int nthreads) {
#ifdef HAVE_AMX
    const int64_t kt = amx ? AKT : KT;
#else
    (void)amx; /* no tiles in this build */
    const int64_t kt = KT;
#endif
    const int64_t G = Hq / Hkv, MT = MAXQ / G, tok = Hkv * D;
    int64_t items = 0, blocks = 0, words = 0; /* words: bfloat16 values of K (and as many of V) */
    for (int64_t s = 0; s < S; s++) {
        items += Hkv * ceil_div(qlen[s], MT);
        blocks += Hkv * ceil_div(klen[s], kt);
        words += Hkv * ceil_div(klen[s], kt) * kt * D;
    }
    uint16_t* kbuf = malloc(sizeof(uint16_t) * words);
    uint16_t* vbuf = malloc(sizeof(uint16_t) * words);
    if (kbuf == NULL || vbuf == NULL) {
        free(kbuf);
        free(vbuf);
        return -1;
    }
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static)
        for (int64_t it = 0; it < blocks; it++) {
            int64_t rest = it, s = 0, base = 0; /* base: sequence s's first word */
            while (rest >= Hkv * ceil_div(klen[s], kt)) {
                rest -= Hkv * ceil_div(klen[s], kt);
                base += Hkv * ceil_div(klen[s], kt) * kt * D;
                s++;
            }
            const int64_t per_head = ceil_div(klen[s], kt), kpad = per_head * kt;
            const int64_t h = rest / per_head, j0 = rest % per_head * kt, head = base + h * kpad * D;
            const int64_t n = klen[s] - j0 < kt ? klen[s] - j0 : kt;
            const int32_t* table = tables + trow[s] * W;
#ifdef HAVE_AMX
            if (amx) {
                convert_kv_block_amx(kc, vc, table, BS, tok, h, D, j0, n, kpad, kbuf + head + j0 * D, vbuf + head);
                continue;
            }
#endif
            convert_kv_tile(kc, vc, table, BS, tok, h, D, j0, n, kbuf + head + j0 * D,
                            (uint32_t*)vbuf + (head + j0 * D) / 2);
        }
        float* scratch = malloc(sizeof(float) * (MAXQ * D / 2 + MAXQ * D + MAXQ * kt + MAXQ * kt / 2));
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#ifdef HAVE_AMX
        if (amx) amx_configure();
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (scratch == NULL) continue;
            int64_t rest = it, s = 0, base = 0;
            while (rest >= Hkv * ceil_div(qlen[s], MT)) {
                rest -= Hkv * ceil_div(qlen[s], MT);
                base += Hkv * ceil_div(klen[s], kt) * kt * D;
                s++;
            }
            const int64_t tile = ceil_div(qlen[s], MT) - 1 - rest / Hkv, h = rest % Hkv;
            const int64_t i0 = tile * MT, m = qlen[s] - i0 < MT ? qlen[s] - i0 : MT;
            const int64_t kpad = ceil_div(klen[s], kt) * kt, head = base + h * kpad * D, off = klen[s] - qlen[s];
            uint32_t* qt = (uint32_t*)scratch;
            float *acc = scratch + MAXQ * D / 2, *pt = acc + MAXQ * D;
            uint32_t* pp = (uint32_t*)(pt + MAXQ * kt);
            const float* qq = q + qstart[s] * qs;
            float* oo = out + qstart[s] * Hq * D;
#ifdef HAVE_AMX
            if (amx) {
                prefill_item_amx(qq, qs, oo, kbuf + head, vbuf + head, kpad, h, G, Hq, D, i0, m, off, scale, qt, acc,
                                 pt, pp);
                continue;
            }
#endif
            const uint32_t* vp = (const uint32_t*)vbuf + head / 2;
            if (D == 64)
                prefill_item_bf16(qq, qs, oo, kbuf + head, vp, h, G, Hq, 64, i0, m, off, scale, qt, acc, pt, pp);
            else
                prefill_item_bf16(qq, qs, oo, kbuf + head, vp, h, G, Hq, D, i0, m, off, scale, qt, acc, pt, pp);
        }
#ifdef HAVE_AMX
        if (amx) _tile_release();
#endif
        free(scratch);
    }
    free(kbuf);
    free(vbuf);
    return failed ? -1 : 0;
}

/* paged_prefill_f32's arguments: with bfloat16 products through AVX512-BF16 */
int paged_prefill_bf16(const float* q, int64_t qs, float* out, const float* kc, const float* vc,
                       const int32_t* tables, int64_t W, const int64_t* trow, const int64_t* qstart,
                       const int64_t* qlen, const int64_t* klen, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                       int64_t BS, float scale, int nthreads) {
    return bf16_prefill_run(0, q, qs, out, kc, vc, tables, W, trow, qstart, qlen, klen, S, Hq, Hkv, D, BS, scale,
                            nthreads);
}

/* the same on AMX tiles where they serve (D a multiple of 32, at most 256), else through AVX512-BF16 */
int paged_prefill_amx(const float* q, int64_t qs, float* out, const float* kc, const float* vc,
                      const int32_t* tables, int64_t W, const int64_t* trow, const int64_t* qstart,
                      const int64_t* qlen, const int64_t* klen, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                      int64_t BS, float scale, int nthreads) {
#ifdef HAVE_AMX
    const int amx = amx_on && amx_granted() && D % 32 == 0 && D <= 256;
#else
    const int amx = 0;
#endif
    return bf16_prefill_run(amx, q, qs, out, kc, vc, tables, W, trow, qstart, qlen, klen, S, Hq, Hkv, D, BS, scale,
                            nthreads);
}
#else
int has_bf16_prefill(void) { return 0; }
int has_amx_prefill(void) { return 0; }
void set_amx_prefill(int on) { (void)on; }
#endif
