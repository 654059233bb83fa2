/* Weight-only quantized linears (and float32 / bfloat16 ones): read the 4-/8-bit codes, dequantize in
   registers or L1, fp32 FMA. The Python side is tgi_llm/quant/kernels.py. */

#include "amx.h"
#include "kernels.h"
#include "vectors.h"
#include <math.h>
#include <stdlib.h>
#include <unistd.h>


#define NV (32 / VL) /* vectors per 32 weights */
#define MT 4         /* activation rows per pass over a weight row */
/* Locality of the decode kernels' code prefetches: 3 (prefetcht0). The non-temporal hint (0) they had
   capped a thread's stream from L3 on the AMX Xeon: SmolLM2's Q8_0 LM head alone (28 MB, in L3) 2.6 ms with
   it, 0.82 ms without, out of DRAM (300 MB) the same either way; a decode step at one row 10.4 -> 9.0 ms. */
#define PF_LOCALITY 3

/* 32 codes of a q4 block (16 bytes: element j in the low nibble of byte j, j + 16 in its high nibble) as
   NV float vectors, in order */
static inline void unpack_q4(const uint8_t* p, V* out) {
#if defined(__AVX512F__)
    const __m128i r = _mm_loadu_si128((const __m128i*)p), m = _mm_set1_epi8(15);
    out[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(r, m)));
    out[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(r, 4), m)));
#elif defined(__AVX2__) && defined(__FMA__)
    const __m128i r = _mm_loadu_si128((const __m128i*)p), m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(r, m), hi = _mm_and_si128(_mm_srli_epi16(r, 4), m);
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    out[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    out[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
#else
    for (int j = 0; j < 16; j++) {
        out[j / VL][j % VL] = (float)(p[j] & 15);
        out[(j + 16) / VL][j % VL] = (float)(p[j] >> 4);
    }
#endif
}

/* 16 signed codes as 16 / VL float vectors */
static inline void unpack_q8(const int8_t* p, V* out) {
#if defined(__AVX512F__)
    out[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
#elif defined(__AVX2__) && defined(__FMA__)
    /* two 8-byte loads the widening folds in as its memory operand: no byte shift (~15% of the kernel) */
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8))));
#else
    for (int j = 0; j < 16; j++) out[j / VL][j % VL] = (float)p[j];
#endif
}

static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0x1F) bits = sign | 0x7F800000u | (man << 13);
    else if (exp) bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) bits = sign;
    else { /* subnormal half: normalize */
        int e = -1;
        uint32_t m = man;
        do { e++; m <<= 1; } while (!(m & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((m & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

static inline __attribute__((always_inline)) float scale_at(const void* s, const int F16, int64_t i) {
    return F16 ? half_to_float(((const uint16_t*)s)[i]) : ((const float*)s)[i];
}

/* VL scales (or mins) from index i as a float vector */
static inline __attribute__((always_inline)) V pscale(const void* s, const int F16, const int64_t i) {
    if (!F16) return vld((const float*)s + i);
#if defined(__AVX512F__)
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)s + i)));
#elif defined(__AVX2__) && defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)s + i)));
#else
    float t[VL];
    for (int l = 0; l < VL; l++) t[l] = half_to_float(((const uint16_t*)s)[i + l]);
    return vld(t);
#endif
}

/* y[m] = sum_k w[k] x[m][k] for one q4 row and MTC activation rows */
static inline __attribute__((always_inline)) void q4_row(
    const uint8_t* restrict q, const void* sc, const void* mn, const int F16, const int64_t bpg,
    const float* restrict x, const int64_t ldx, const float* restrict xs, const int64_t G, const int MTC,
    float* restrict y, const int64_t ldy) {
    const int P = 1; /* one FMA chain per activation row: more measured no faster (Zen 3) */
    V acc[MT];
    float msum[MT];
    UNROLL for (int m = 0; m < MTC; m++) { acc[m] = vzero(); msum[m] = 0.f; }
    for (int64_t gi = 0; gi < G; gi++) {
        V s[MT][NV];
        UNROLL for (int m = 0; m < MTC; m++) UNROLL for (int i = 0; i < P; i++) s[m][i] = vzero();
        for (int64_t b = gi * bpg; b < (gi + 1) * bpg; b++) {
            V w[NV];
            unpack_q4(q + b * 16, w);
            UNROLL for (int i = 0; i < NV; i++)
                UNROLL for (int m = 0; m < MTC; m++)
                    s[m][i % P] = vfma(w[i], vld(x + m * ldx + b * 32 + i * VL), s[m][i % P]);
        }
        UNROLL for (int m = 0; m < MTC; m++) {
            UNROLL for (int i = 1; i < P; i++) s[m][0] = vadd(s[m][0], s[m][i]);
            acc[m] = vfma(s[m][0], vset1(scale_at(sc, F16, gi)), acc[m]);
            msum[m] += scale_at(mn, F16, gi) * xs[m * G + gi];
        }
    }
    UNROLL for (int m = 0; m < MTC; m++) y[m * ldy] = vsum(acc[m]) + msum[m];
}

#ifndef Q8_PF
#define Q8_PF 2048
#endif
/* as q4_row; mn (a min per group, asymmetric int8) may be NULL */
static inline __attribute__((always_inline)) void q8_row(
    const int8_t* restrict q, const void* sc, const void* mn, const int F16, const int64_t g,
    const float* restrict x, const int64_t ldx, const float* restrict xs, const int64_t G, const int MTC,
    float* restrict y, const int64_t ldy) {
    const int P = 1;
    V acc[MT];
    float msum[MT];
    UNROLL for (int m = 0; m < MTC; m++) { acc[m] = vzero(); msum[m] = 0.f; }
    for (int64_t gi = 0; gi < G; gi++) {
        V s[MT][16 / VL];
        UNROLL for (int m = 0; m < MTC; m++) UNROLL for (int i = 0; i < P; i++) s[m][i] = vzero();
        for (int64_t c = gi * g; c < (gi + 1) * g; c += 16) {
            V w[16 / VL];
            if (Q8_PF) __builtin_prefetch(q + c + Q8_PF, 0, PF_LOCALITY);
            unpack_q8(q + c, w);
            UNROLL for (int i = 0; i < 16 / VL; i++)
                UNROLL for (int m = 0; m < MTC; m++)
                    s[m][i % P] = vfma(w[i], vld(x + m * ldx + c + i * VL), s[m][i % P]);
        }
        UNROLL for (int m = 0; m < MTC; m++) {
            UNROLL for (int i = 1; i < P; i++) s[m][0] = vadd(s[m][0], s[m][i]);
            acc[m] = vfma(s[m][0], vset1(scale_at(sc, F16, gi)), acc[m]);
        }
    }
    if (mn) { /* + sum_g min_g * (sum of x over group g): one dot product over the groups, not one per group */
        int64_t gi = 0;
        for (; gi + VL <= G; gi += VL) {
            const V mi = pscale(mn, F16, gi);
            UNROLL for (int m = 0; m < MTC; m++) acc[m] = vfma(mi, vld(xs + m * G + gi), acc[m]);
        }
        for (; gi < G; gi++) UNROLL for (int m = 0; m < MTC; m++) msum[m] += scale_at(mn, F16, gi) * xs[m * G + gi];
    }
    UNROLL for (int m = 0; m < MTC; m++) y[m * ldy] = vsum(acc[m]) + msum[m];
}

#define ROWS_PER_CHUNK 16
#define MAX_GROUPS 4096 /* K / 32 at most: K <= 131072, checked in Python */

/* [M][K / g]: the sums of each activation row over each group of g columns (the mins' factor), malloc'd */
static float* group_sums(const float* x, const int64_t ldx, const int64_t M, const int64_t K, const int64_t g) {
    const int64_t G = K / g;
    float* xs = malloc(sizeof(float) * (M * G + 1));
    for (int64_t m = 0; m < M; m++)
        for (int64_t gi = 0; gi < G; gi++) {
            float s = 0.f;
            for (int64_t k = gi * g; k < (gi + 1) * g; k++) s += x[m * ldx + k];
            xs[m * G + gi] = s;
        }
    return xs;
}

/* x: [M, K] (row stride ldx), y: [M, N] (row stride ldy); codes [N, K/2] (q4) or [N, K] (q8);
   scales/mins [N, K/g], float16 when f16 else float32. Threads split the output rows. */
void q4_linear(const uint8_t* codes, const void* scales, const void* mins, int f16, int64_t g,
               const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K, int nthreads) {
    const int64_t G = K / g, bpg = g / 32;
    float* xs = group_sums(x, ldx, M, K, g); /* for the mins */
    const int64_t chunks = (N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
    const size_t ss = f16 ? 2 : 4;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t n1 = (c + 1) * ROWS_PER_CHUNK < N ? (c + 1) * ROWS_PER_CHUNK : N;
        for (int64_t n = c * ROWS_PER_CHUNK; n < n1; n++) {
            const void *sc = (const char*)scales + n * G * ss, *mn = (const char*)mins + n * G * ss;
            const uint8_t* q = codes + n * (K / 2);
            for (int64_t m0 = 0; m0 < M; m0 += MT) {
                const float *xm = x + m0 * ldx, *xsm = xs + m0 * G;
                float* ym = y + m0 * ldy + n;
#define Q4(F, R) q4_row(q, sc, mn, F, bpg, xm, ldx, xsm, G, R, ym, ldy)
                switch ((M - m0 < MT ? M - m0 : MT) * 2 + f16) {
                    case 9: Q4(1, 4); break;
                    case 8: Q4(0, 4); break;
                    case 7: Q4(1, 3); break;
                    case 6: Q4(0, 3); break;
                    case 5: Q4(1, 2); break;
                    case 4: Q4(0, 2); break;
                    case 3: Q4(1, 1); break;
                    default: Q4(0, 1); break;
                }
#undef Q4
            }
        }
    }
    free(xs);
}

void q8_linear(const int8_t* codes, const void* scales, const void* mins, int f16, int64_t g, const float* x,
               int64_t ldx, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K, int nthreads) {
    const int64_t G = K / g, chunks = (N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
    const size_t ss = f16 ? 2 : 4;
    float* xs = mins ? group_sums(x, ldx, M, K, g) : 0;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t n1 = (c + 1) * ROWS_PER_CHUNK < N ? (c + 1) * ROWS_PER_CHUNK : N;
        for (int64_t n = c * ROWS_PER_CHUNK; n < n1; n++) {
            const void* sc = (const char*)scales + n * G * ss;
            const void* mn = mins ? (const char*)mins + n * G * ss : 0;
            const int8_t* q = codes + n * K;
            for (int64_t m0 = 0; m0 < M; m0 += MT) {
                const float *xm = x + m0 * ldx, *xsm = xs ? xs + m0 * G : 0;
                float* ym = y + m0 * ldy + n;
#define Q8(F, R) q8_row(q, sc, mn, F, g, xm, ldx, xsm, G, R, ym, ldy)
                switch ((M - m0 < MT ? M - m0 : MT) * 2 + f16) {
                    case 9: Q8(1, 4); break;
                    case 8: Q8(0, 4); break;
                    case 7: Q8(1, 3); break;
                    case 6: Q8(0, 3); break;
                    case 5: Q8(1, 2); break;
                    case 4: Q8(0, 2); break;
                    case 3: Q8(1, 1); break;
                    default: Q8(0, 1); break;
                }
#undef Q8
            }
        }
    }
    free(xs);
}

/* ---- plain float32 weights [N, K] (K % VL == 0): the same decode kernel shape without codes. One weight
   vector feeds every activation row; R output rows at a time keep R * MTC FMA chains in flight (one chain
   per row at one token would be FMA-latency bound, ~1 vector per 4 cycles). */
static inline __attribute__((always_inline)) void f32_rows(
    const float* restrict w, const int64_t K, const float* restrict x, const int64_t ldx, const int MTC,
    const int R, float* restrict y, const int64_t ldy) {
    V acc[4][MT];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int m = 0; m < MTC; m++) acc[r][m] = vzero();
    for (int64_t k = 0; k < K; k += VL) {
        UNROLL for (int r = 0; r < R; r++) {
            const V wv = vld(w + r * K + k);
            UNROLL for (int m = 0; m < MTC; m++) acc[r][m] = vfma(wv, vld(x + m * ldx + k), acc[r][m]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int m = 0; m < MTC; m++) y[m * ldy + r] = vsum(acc[r][m]);
}

void f32_linear(const float* weight, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int64_t N,
                int64_t K, int nthreads) {
    const int64_t chunks = (N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t n1 = (c + 1) * ROWS_PER_CHUNK < N ? (c + 1) * ROWS_PER_CHUNK : N;
        for (int64_t m0 = 0; m0 < M; m0 += MT) {
            const int mt = M - m0 < MT ? (int)(M - m0) : MT;
            const float* xm = x + m0 * ldx;
            int64_t n = c * ROWS_PER_CHUNK;
            for (; mt <= 2 && n + 4 <= n1; n += 4) { /* few rows: 4 output rows per pass */
                if (mt == 1) f32_rows(weight + n * K, K, xm, ldx, 1, 4, y + m0 * ldy + n, ldy);
                else f32_rows(weight + n * K, K, xm, ldx, 2, 4, y + m0 * ldy + n, ldy);
            }
            for (; mt > 2 && M > MT && n + 2 <= n1; n += 2) { /* re-read from L2: fewer loads per FMA */
                if (mt == 4) f32_rows(weight + n * K, K, xm, ldx, 4, 2, y + m0 * ldy + n, ldy);
                else f32_rows(weight + n * K, K, xm, ldx, 3, 2, y + m0 * ldy + n, ldy);
            }
            for (; n < n1; n++) {
                const float* wn = weight + n * K;
                float* ym = y + m0 * ldy + n;
                switch (mt) {
                    case 4: f32_rows(wn, K, xm, ldx, 4, 1, ym, ldy); break;
                    case 3: f32_rows(wn, K, xm, ldx, 3, 1, ym, ldy); break;
                    case 2: f32_rows(wn, K, xm, ldx, 2, 1, ym, ldy); break;
                    default: f32_rows(wn, K, xm, ldx, 1, 1, ym, ldy); break;
                }
            }
        }
    }
}

/* ---- q4 codes in the "x8" byte order: per 64 weights 8 words, nibble i of word j = weight 8i + j ---- */

/* 8 codes (weights 8i .. 8i + 7 of a 64-chunk) as floats: a shift, a mask, a conversion */
#if defined(__AVX2__) && defined(__FMA__)
typedef __m256i W8;
static inline W8 x8_load(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
static inline __m256 x8_codes(W8 v, int i) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 4 * i), _mm256_set1_epi32(15)));
}
#define X8V __m256
#define x8ld(p) _mm256_loadu_ps(p)
#define x8fma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define x8zero() _mm256_setzero_ps()
#define x8set1(v) _mm256_set1_ps(v)
static inline float x8sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#else
typedef struct { uint32_t w[8]; } W8;
typedef float X8V __attribute__((vector_size(32)));
static inline W8 x8_load(const uint8_t* p) { W8 v; memcpy(v.w, p, 32); return v; }
static inline X8V x8_codes(W8 v, int i) {
    X8V f;
    for (int j = 0; j < 8; j++) f[j] = (float)((v.w[j] >> (4 * i)) & 15);
    return f;
}
static inline X8V x8ld(const float* p) { X8V v; memcpy(&v, p, 32); return v; }
#define x8fma(a, b, c) ((a) * (b) + (c))
#define x8zero() ((X8V){0})
#define x8set1(v) ((X8V){0} + (v))
static inline float x8sum(X8V v) { float s = 0.f; for (int j = 0; j < 8; j++) s += v[j]; return s; }
#endif

/* A row's scales and mins per 32-weight block as float32 (F16C converts 8 at a time) */
static inline void block_scales(const void* s, const int f16, const int64_t g, const int64_t B, float* out) {
#if defined(__F16C__)
    if (f16 && g == 32) {
        int64_t b = 0;
        for (; b + 8 <= B; b += 8)
            _mm256_storeu_ps(out + b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)s + b))));
        for (; b < B; b++) out[b] = half_to_float(((const uint16_t*)s)[b]);
        return;
    }
#endif
    for (int64_t b = 0; b < B; b++) out[b] = f16 ? half_to_float(((const uint16_t*)s)[b * 32 / g])
                                                : ((const float*)s)[b * 32 / g];
}

static inline __attribute__((always_inline)) void q4x8_row(
    const uint8_t* restrict q, const float* restrict scb, const float* restrict x, const int64_t ldx,
    const int MTC, const int64_t K, float* restrict y, const int64_t ldy) {
    X8V acc[MT][2]; /* one per half: two independent accumulation chains */
    UNROLL for (int m = 0; m < MTC; m++) acc[m][0] = acc[m][1] = x8zero();
    for (int64_t c = 0; c < K / 64; c++) {
        const W8 v = x8_load(q + 32 * c);
        UNROLL for (int h = 0; h < 2; h++) { /* two 32-weight blocks per word set */
            X8V s[MT];
            UNROLL for (int m = 0; m < MTC; m++) s[m] = x8zero();
            UNROLL for (int i = 4 * h; i < 4 * h + 4; i++) {
                const X8V w = x8_codes(v, i);
                UNROLL for (int m = 0; m < MTC; m++) s[m] = x8fma(w, x8ld(x + m * ldx + 64 * c + 8 * i), s[m]);
            }
            const X8V scale = x8set1(scb[2 * c + h]);
            UNROLL for (int m = 0; m < MTC; m++) acc[m][h] = x8fma(s[m], scale, acc[m][h]);
        }
    }
    UNROLL for (int m = 0; m < MTC; m++) y[m * ldy] = x8sum(acc[m][0] + acc[m][1]);
}

void q4x8_linear(const uint8_t* codes, const void* scales, const void* mins, int f16, int64_t g,
                 const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K, int nthreads) {
    const int64_t G = K / g, B = K / 32;
    float* xsb = group_sums(x, ldx, M, K, 32); /* per 32-weight block, for the mins */
    const int64_t chunks = (N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
    const size_t ss = f16 ? 2 : 4;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        float scb[MAX_GROUPS], mnb[MAX_GROUPS];
        const int64_t n1 = (c + 1) * ROWS_PER_CHUNK < N ? (c + 1) * ROWS_PER_CHUNK : N;
        for (int64_t n = c * ROWS_PER_CHUNK; n < n1; n++) {
            block_scales((const char*)scales + n * G * ss, f16, g, B, scb);
            block_scales((const char*)mins + n * G * ss, f16, g, B, mnb);
            const uint8_t* q = codes + n * (K / 2);
            for (int64_t m0 = 0; m0 < M; m0 += MT) {
                const float* xm = x + m0 * ldx;
                float* ym = y + m0 * ldy + n;
                switch (M - m0 < MT ? M - m0 : MT) {
                    case 4: q4x8_row(q, scb, xm, ldx, 4, K, ym, ldy); break;
                    case 3: q4x8_row(q, scb, xm, ldx, 3, K, ym, ldy); break;
                    case 2: q4x8_row(q, scb, xm, ldx, 2, K, ym, ldy); break;
                    default: q4x8_row(q, scb, xm, ldx, 1, K, ym, ldy); break;
                }
            }
            for (int64_t m = 0; m < M; m++) { /* the mins: sum over blocks of min * (sum of x over the block) */
                X8V a = x8zero();
                int64_t b = 0;
                for (; b + 8 <= B; b += 8) a = x8fma(x8ld(mnb + b), x8ld(xsb + m * B + b), a);
                float t = x8sum(a);
                for (; b < B; b++) t += mnb[b] * xsb[m * B + b];
                y[m * ldy + n] += t;
            }
        }
    }
    free(xsb);
}

/* no FMA contraction where weights are dequantized: w = q * scale (+ min) rounded after the product and
   after the sum, like torch's and gguf-py's dequantization (bit-exact results) */
#define NO_FMA __attribute__((optimize("fp-contract=off")))

/* ---- many activation rows: a register-blocked GEMM over a dequantized, transposed panel ----
   The kernels above turn every code into a float once per MT activation rows, and each x value they load
   feeds one FMA: at 8-128 rows they run at half the FMA rate. Here each thread dequantizes a panel of NW
   weight rows x KC columns once (into L1, exactly as torch dequantizes), transposed so that a vector holds
   NW/2 output columns at one k; the micro-kernel broadcasts one x value per activation row and k and keeps
   MR x NW outputs in registers (GotoBLAS's scheme): per k, 2 weight loads and MR broadcasts feed 2 MR FMAs,
   and no horizontal sums. */
#if defined(__AVX512F__)
#define MR 8 /* 16 accumulators + 2 w + 1 x of 32 registers */
#else
#define MR 6 /* 12 accumulators + 2 w + 1 x of 16 */
#endif
#define NW (2 * VL) /* weight rows per panel */
#define KC 256

/* row n, columns [k0, k1) as float32 into out, as QuantizedWeight.dequantize computes them. Scales are
   looked up per block of 16 (q8) or 32 (q4) weights by counting, not dividing: a 64-bit division per block
   cost more than all the rest. */
__attribute__((noinline)) NO_FMA static void dequant_segment(
    int kind, const void* codes, const void* scales, const void* mins, int f16, int64_t g, int64_t K,
    int64_t n, int64_t k0, int64_t k1, float* restrict out) {
    if (kind == 4) { /* float32: nothing to convert */
        memcpy(out, (const float*)codes + n * K + k0, (k1 - k0) * sizeof(float));
        return;
    }
    const int64_t G = K / g, blk = kind == 2 ? 16 : 32, nb = (k1 - k0) / blk;
    const size_t ss = f16 ? 2 : 4;
    const void *sc = (const char*)scales + n * G * ss, *mn = mins ? (const char*)mins + n * G * ss : 0;
    float s[KC / 16], m[KC / 16];
    for (int64_t b = 0, gi = k0 / g, left = g - k0 % g; b < nb; b++) {
        s[b] = scale_at(sc, f16, gi);
        if (mn) m[b] = scale_at(mn, f16, gi);
        if ((left -= blk) == 0) { gi++; left = g; }
    }
    if (kind == 2) { /* q8 */
        for (int64_t b = 0; b < nb; b++) {
            V w[16 / VL];
            unpack_q8((const int8_t*)codes + n * K + k0 + 16 * b, w);
            const V add = vset1(mn ? m[b] : 0.f); /* q * s + 0 rounds as q * s */
            UNROLL for (int i = 0; i < 16 / VL; i++) vst(out + 16 * b + i * VL, vadd(vmul(w[i], vset1(s[b])), add));
        }
        return;
    }
    const uint8_t* q = (const uint8_t*)codes + n * (K / 2) + k0 / 2;
    if (kind == 1) { /* q4, x8 order: 64 weights (two blocks) per 32 bytes */
        for (int64_t c = 0; c < nb / 2; c++) {
            const W8 v = x8_load(q + 32 * c);
            UNROLL for (int i = 0; i < 8; i++) {
                const X8V p = x8_codes(v, i) * x8set1(s[2 * c + i / 4]);
                const X8V w = p + x8set1(m[2 * c + i / 4]);
                memcpy(out + 64 * c + 8 * i, &w, 32);
            }
        }
        return;
    }
    for (int64_t b = 0; b < nb; b++) { /* q4, GGUF order */
        V w[NV];
        unpack_q4(q + b * 16, w);
        UNROLL for (int i = 0; i < NV; i++) vst(out + b * 32 + i * VL, vadd(vmul(w[i], vset1(s[b])), vset1(m[b])));
    }
}

/* tmp [NW][KC] (row-major, kc columns) -> out [kc][NW] */
static inline void transpose_panel(const float* restrict tmp, const int64_t kc, float* restrict out) {
#if defined(__AVX2__)
    for (int64_t k = 0; k < kc; k += 8)
        for (int r = 0; r < NW; r += 8) { /* 8 x 8 blocks in registers */
            __m256 a[8], b[8];
            for (int i = 0; i < 8; i++) a[i] = _mm256_loadu_ps(tmp + (r + i) * KC + k);
            for (int i = 0; i < 8; i += 2) {
                b[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
                b[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
            }
            for (int i = 0; i < 8; i += 4)
                for (int j = 0; j < 2; j++) {
                    a[i + j] = _mm256_shuffle_ps(b[i + j], b[i + j + 2], _MM_SHUFFLE(1, 0, 1, 0));
                    a[i + j + 2] = _mm256_shuffle_ps(b[i + j], b[i + j + 2], _MM_SHUFFLE(3, 2, 3, 2));
                }
            /* a[0], a[2], a[1], a[3] hold columns 0, 1, 2, 3 of rows 0-3 (low half) and 4-7 of ... */
            const int order[4] = {0, 2, 1, 3};
            for (int j = 0; j < 4; j++) {
                _mm256_storeu_ps(out + (k + j) * NW + r,
                                 _mm256_permute2f128_ps(a[order[j]], a[order[j] + 4], 0x20));
                _mm256_storeu_ps(out + (k + j + 4) * NW + r,
                                 _mm256_permute2f128_ps(a[order[j]], a[order[j] + 4], 0x31));
            }
        }
#else
    for (int64_t k = 0; k < kc; k++)
        for (int r = 0; r < NW; r++) out[k * NW + r] = tmp[r * KC + k];
#endif
}

/* y[m][0:nw] = acc[m] (first k-chunk) or += it, for MRC rows */
static inline __attribute__((always_inline)) void tile_store(V acc[MR][2], const int MRC, float* restrict y,
                                                             const int64_t ldy, const int first, const int64_t nw) {
    if (nw == NW) {
        UNROLL for (int m = 0; m < MRC; m++) UNROLL for (int h = 0; h < 2; h++) {
            float* p = y + m * ldy + h * VL;
            vst(p, first ? acc[m][h] : vadd(acc[m][h], vld(p)));
        }
    } else { /* the last, narrower panel */
        float out[2 * VL];
        UNROLL for (int m = 0; m < MRC; m++) {
            vst(out, acc[m][0]);
            vst(out + VL, acc[m][1]);
            for (int64_t n = 0; n < nw; n++) y[m * ldy + n] = first ? out[n] : y[m * ldy + n] + out[n];
        }
    }
}

/* y[m][0:nw] (+)= x[m] . w[0:nw] for MRC activation rows; w given as panel [kc][NW] */
static inline __attribute__((always_inline)) void gemm_tile(
    const float* restrict x, const int64_t ldx, const float* restrict w, const int64_t kc, const int MRC,
    float* restrict y, const int64_t ldy, const int first, const int64_t nw) {
    V acc[MR][2];
    UNROLL for (int m = 0; m < MRC; m++) acc[m][0] = acc[m][1] = vzero();
    for (int64_t k = 0; k < kc; k++) {
        const V w0 = vld(w + k * NW), w1 = vld(w + k * NW + VL);
        UNROLL for (int m = 0; m < MRC; m++) {
            const V a = vset1(x[m * ldx + k]);
            acc[m][0] = vfma(a, w0, acc[m][0]);
            acc[m][1] = vfma(a, w1, acc[m][1]);
        }
    }
    tile_store(acc, MRC, y, ldy, first, nw);
}

/* kind: 0 q4 (GGUF order), 1 q4 (x8 order), 2 q8, 4 float32; x [M, K] (row stride ldx) -> y [M, N] (row stride ldy) */
void quant_gemm(int kind, const void* codes, const void* scales, const void* mins, int f16, int64_t g,
                const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K, int nthreads) {
    const int64_t panels = (N + NW - 1) / NW;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        float tmp[NW * KC] __attribute__((aligned(64))), w[KC * NW] __attribute__((aligned(64)));
        const int64_t n0 = p * NW, nw = N - n0 < NW ? N - n0 : NW;
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
            const int64_t kc = K - k0 < KC ? K - k0 : KC;
            for (int64_t r = 0; r < NW; r++) {
                if (r < nw) dequant_segment(kind, codes, scales, mins, f16, g, K, n0 + r, k0, k0 + kc, tmp + r * KC);
                else memset(tmp + r * KC, 0, kc * sizeof(float));
            }
            transpose_panel(tmp, kc, w);
            for (int64_t m0 = 0; m0 < M; m0 += MR) {
                const float* xm = x + m0 * ldx + k0;
                float* ym = y + m0 * ldy + n0;
                switch (M - m0 < MR ? M - m0 : MR) {
#define T(a) case a: gemm_tile(xm, ldx, w, kc, a, ym, ldy, k0 == 0, nw); break
#if MR == 8
                    T(8); T(7);
#endif
                    T(6); T(5); T(4); T(3); T(2); default: gemm_tile(xm, ldx, w, kc, 1, ym, ldy, k0 == 0, nw);
#undef T
                }
            }
        }
    }
}
/* ---- q4 codes in the "panel" order: VL output rows per panel, so a vector holds one k of VL rows ----
   Per panel and 8 consecutive k: VL little-endian 32-bit words, nibble i of word j = code(row j, k + i);
   scales and mins [N / VL][G][VL]. `(word >> 4i) & 15` turns 8 codes into VL lanes with two vector ops,
   and the outputs of a panel are VL adjacent floats: no transposes, no horizontal sums, no weight panel
   in memory (the "gemm" above spends as long dequantizing into L1 as multiplying below ~32 rows). */
int panel_lanes(void) { return VL; }

typedef float VF __attribute__((vector_size(VL * 4)));
typedef uint32_t VU __attribute__((vector_size(VL * 4)));
static inline VU pload(const uint8_t* p) { VU v; memcpy(&v, p, sizeof v); return v; }
/* Code i of each lane's word as a float. On AVX-512 a permute looks it up in {0, ..., 15}, reading only the
   index's low 4 bits: a shift and a permute (p5) where shift, mask and convert took three uops, two of them
   on the port the FMAs share (q4 decode at one row is bound by this: ~2 cycles per 16 weights). Same values. */
static inline __attribute__((always_inline)) V pcode(const VU w, const int i) {
#if defined(__AVX512F__) && VL == 16
    const __m512 values = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f, 12.f, 13.f,
                                         14.f, 15.f);
    return _mm512_permutexvar_ps((__m512i)(w >> (4 * i)), values);
#else
    return (V)__builtin_convertvector((VI)((w >> (4 * i)) & 15u), VF);
#endif
}
/* Few activation rows: per group, part = sum(q * x) in each lane (one output row), then
   acc += scale * part + min * (sum of x over the group). Two panels per pass: each broadcast x feeds two FMAs. */
/* Codes are prefetched this far ahead: at one token the kernel streams the whole model from DRAM, and the
   hardware prefetcher alone kept it at ~6 GB/s of ~19 (measured on Zen 3; 1-8 KB tried, 2 KB best). */
#define PF_BYTES 2048
/* Activation rows per pass of the panel decode kernels (every pass streams the codes again). Their
   accumulators live in y (a load and a store per group of codes), so the registers hold the 2 PT partial
   sums, the codes and x: 3 rows on AVX2's 16, 12 on AVX-512's 32 (item 42; 6 with the accumulators in
   registers, item 39). All layer linears of SmolLM2-135M (Xeon, AMX host, alternated, medians of 20), q4,
   against 6 rows a pass: 8 rows 11.45 -> 10.47 ms, 10 rows 13.27 -> 12.27, 12 rows 14.88 -> 14.35, 16
   rows 20.5 -> 19.3 (the GEMM 18.8); 1-6 rows level. */
#if defined(__AVX512F__)
#define PT 12
/* q4 passes of more rows take one panel at a time: 16 partial sums, each broadcast x feeding one FMA. 13-16
   rows, all layer linears (as above), against 12 + 1-4 rows and the GEMM: 15 rows 24.0 -> 20.7 ms (GEMM
   23.9), 16 rows 26.5 -> 24.5 and 23.8 -> 21.4 (GEMM 26.5, 22.7). */
#define PT1 16
#else
#define PT 3
#define PT1 PT
#endif
/* the most rows a pass of the q4 panel decode kernel takes */
int panel_rows_per_pass(void) { return PT1; }
static inline __attribute__((always_inline)) void q4p_rows(
    const uint8_t* restrict q, const void* sc, const void* mn, const int F16, const int64_t g, const int64_t G,
    const int64_t K, const int NP, const float* restrict x, const int64_t ldx, const float* restrict xs,
    const int MTC, float* restrict y, const int64_t ldy) {
    /* Partial sums per output vector: two (even and odd codes) where MTC * NP chains of 4-cycle FMAs would
       bound the loop (one row: ~2 cycles per 16 weights), one where the registers are needed for rows. */
    const int PS = MTC == 1 || (VL == 16 && MTC == 2) ? 2 : 1;
    for (int64_t gi = 0; gi < G; gi++) {
        V part[PT1][2][2];
        UNROLL for (int m = 0; m < MTC; m++) UNROLL for (int h = 0; h < NP; h++) UNROLL for (int j = 0; j < PS; j++)
            part[m][h][j] = vzero();
        for (int64_t k = gi * g; k < (gi + 1) * g; k += 8) {
            VU w[2];
            UNROLL for (int h = 0; h < NP; h++) {
                const uint8_t* qh = q + h * VL * (K / 2) + k / 8 * VL * 4;
                __builtin_prefetch(qh + PF_BYTES, 0, PF_LOCALITY);
                w[h] = pload(qh);
            }
            UNROLL for (int i = 0; i < 8; i++) {
                V c[2];
                UNROLL for (int h = 0; h < NP; h++) c[h] = pcode(w[h], i);
                UNROLL for (int m = 0; m < MTC; m++) {
                    const V a = vset1(x[m * ldx + k + i]);
                    UNROLL for (int h = 0; h < NP; h++) part[m][h][i % PS] = vfma(c[h], a, part[m][h][i % PS]);
                }
            }
        }
        UNROLL for (int h = 0; h < NP; h++) {
            const V s = pscale(sc, F16, (h * G + gi) * VL), mi = pscale(mn, F16, (h * G + gi) * VL);
            UNROLL for (int m = 0; m < MTC; m++) {
                const V part_m = PS == 2 ? vadd(part[m][h][0], part[m][h][1]) : part[m][h][0];
                float* acc = y + m * ldy + h * VL;
                vst(acc, vfma(mi, vset1(xs[m * G + gi]), vfma(part_m, s, gi ? vld(acc) : vzero())));
            }
        }
    }
}

void q4p_linear(const uint8_t* codes, const void* scales, const void* mins, int f16, int64_t g,
                const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K, int nthreads) {
    const int64_t G = K / g, panels = N / VL;
    float* xs = group_sums(x, ldx, M, K, g); /* for the mins */
    const size_t ss = f16 ? 2 : 4;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t pp = 0; pp < (panels + 1) / 2; pp++) { /* pairs of panels (the last may be single) */
        const int64_t p = 2 * pp;
        const uint8_t* q = codes + p * VL * (K / 2);
        const void *sc = (const char*)scales + p * G * VL * ss, *mn = (const char*)mins + p * G * VL * ss;
        const int np = panels - p >= 2 ? 2 : 1;
        for (int64_t m0 = 0; m0 < M;) {
            const float *xm = x + m0 * ldx, *xsm = xs + m0 * G;
            float* ym = y + m0 * ldy + p * VL;
            const int64_t rows = M - m0 < PT1 ? M - m0 : PT1;
#define R(r) case r: { if (np == 2) q4p_rows(q, sc, mn, f16, g, G, K, 2, xm, ldx, xsm, r, ym, ldy); \
                       else q4p_rows(q, sc, mn, f16, g, G, K, 1, xm, ldx, xsm, r, ym, ldy); } break
#define R1(r) case r: for (int h = 0; h < np; h++) \
                          q4p_rows(q + h * VL * (K / 2), (const char*)sc + h * G * VL * ss, \
                                   (const char*)mn + h * G * VL * ss, f16, g, G, K, 1, xm, ldx, xsm, r, \
                                   ym + h * VL, ldy); \
                      break
            switch (rows) {
#if PT1 == 16
                R1(16); R1(15); R1(14); R1(13);
#endif
#if PT == 12
                R(12); R(11); R(10); R(9); R(8); R(7); R(6); R(5); R(4);
#endif
                R(3); R(2); default: R(1);
            }
#undef R
#undef R1
            m0 += rows;
        }
    }
    free(xs);
}

/* Many activation rows: `quant_gemm`'s micro-kernel over two panels (NW = 2 VL output rows), which the
   panel order dequantizes straight into the k-major layout the micro-kernel reads: no row-by-row
   dequantization and no transpose (they cost as much as the multiplication below ~32 rows). Exactly as
   torch dequantizes (q * scale + min, two roundings: NO_FMA), so the results equal quant_gemm's bit for bit. */
__attribute__((noinline)) NO_FMA static void dequant_panels(
    const uint8_t* restrict q, const void* sc, const void* mn, const int f16, const int64_t g, const int64_t G,
    const int64_t K, const int np, const int64_t k0, const int64_t kc, float* restrict out) {
    for (int h = 0; h < np; h++)
        for (int64_t k = k0; k < k0 + kc; k += 8) {
            const int64_t gi = k / g;
            const V s = pscale(sc, f16, (h * G + gi) * VL), mi = pscale(mn, f16, (h * G + gi) * VL);
            const VU w = pload(q + h * VL * (K / 2) + k / 8 * VL * 4);
            UNROLL for (int i = 0; i < 8; i++) vst(out + (k - k0 + i) * NW + h * VL, vadd(vmul(pcode(w, i), s), mi));
        }
}

/* ---- q8 codes in the "panel" order, NW (2 VL) output rows per panel: [N / NW][K][NW], scales and mins
   [N / NW][G][NW]. Twice the q4 panel's width so that a thread streams one run of bytes (two VL-wide panels
   read side by side were 14% slower at one row: two streams). ---- */
int q8_panel_lanes(void) { return NW; }

/* as q4p_rows over one q8 panel (two vectors of outputs); mn may be NULL (symmetric). At one activation
   row each output vector keeps two partial sums (even and odd k): one FMA chain would be latency-bound. */
static inline __attribute__((always_inline)) void q8p_rows(
    const int8_t* restrict q, const void* sc, const void* mn, const int F16, const int64_t g, const int64_t G,
    const float* restrict x, const int64_t ldx, const float* restrict xs, const int MTC, float* restrict y,
    const int64_t ldy) {
    const int PS = MTC == 1 ? 2 : 1;
    for (int64_t gi = 0; gi < G; gi++) {
        V part[PT][2][2];
        UNROLL for (int m = 0; m < MTC; m++) UNROLL for (int h = 0; h < 2; h++) UNROLL for (int j = 0; j < PS; j++)
            part[m][h][j] = vzero();
        for (int64_t k = gi * g; k < (gi + 1) * g; k += 4) {
            UNROLL for (int b = 0; b < 4 * NW; b += 64) __builtin_prefetch(q + k * NW + b + PF_BYTES, 0, PF_LOCALITY);
            UNROLL for (int i = 0; i < 4; i++) {
                const V c0 = vld_i8(q + (k + i) * NW), c1 = vld_i8(q + (k + i) * NW + VL);
                UNROLL for (int m = 0; m < MTC; m++) {
                    const V a = vset1(x[m * ldx + k + i]);
                    part[m][0][i % PS] = vfma(c0, a, part[m][0][i % PS]);
                    part[m][1][i % PS] = vfma(c1, a, part[m][1][i % PS]);
                }
            }
        }
        UNROLL for (int h = 0; h < 2; h++) {
            const V s = pscale(sc, F16, gi * NW + h * VL);
            UNROLL for (int m = 0; m < MTC; m++) {
                const V part_m = PS == 2 ? vadd(part[m][h][0], part[m][h][1]) : part[m][h][0];
                float* acc = y + m * ldy + h * VL;
                V a = vfma(part_m, s, gi ? vld(acc) : vzero());
                if (mn) a = vfma(pscale(mn, F16, gi * NW + h * VL), vset1(xs[m * G + gi]), a);
                vst(acc, a);
            }
        }
    }
}

void q8p_linear(const int8_t* codes, const void* scales, const void* mins, int f16, int64_t g,
                const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K, int nthreads) {
    const int64_t G = K / g;
    float* xs = mins ? group_sums(x, ldx, M, K, g) : 0;
    const size_t ss = f16 ? 2 : 4;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t p = 0; p < N / NW; p++) {
        const int8_t* q = codes + p * NW * K;
        const void* sc = (const char*)scales + p * G * NW * ss;
        const void* mn = mins ? (const char*)mins + p * G * NW * ss : 0;
        for (int64_t m0 = 0; m0 < M; m0 += PT) {
            const float *xm = x + m0 * ldx, *xsm = xs ? xs + m0 * G : 0;
            float* ym = y + m0 * ldy + p * NW;
#define R(r) case r: q8p_rows(q, sc, mn, f16, g, G, xm, ldx, xsm, r, ym, ldy); break
            switch (M - m0 < PT ? M - m0 : PT) {
#if PT == 12
                R(12); R(11); R(10); R(9); R(8); R(7); R(6); R(5); R(4);
#endif
                R(3); R(2); default: R(1);
            }
#undef R
        }
    }
    free(xs);
}

/* As dequant_panels, for a q8 panel: q * scale (+ min), two roundings; already k-major, NW wide */
__attribute__((noinline)) NO_FMA static void dequant_q8_panel(
    const int8_t* restrict q, const void* sc, const void* mn, const int f16, const int64_t g, const int64_t k0,
    const int64_t kc, float* restrict out) {
    for (int64_t k = k0; k < k0 + kc;) {
        const int64_t gi = k / g, end = (gi + 1) * g < k0 + kc ? (gi + 1) * g : k0 + kc;
        V s[2], mi[2];
        UNROLL for (int h = 0; h < 2; h++) {
            s[h] = pscale(sc, f16, gi * NW + h * VL);
            mi[h] = mn ? pscale(mn, f16, gi * NW + h * VL) : vzero();
        }
        for (; k < end; k++)
            UNROLL for (int h = 0; h < 2; h++)
                vst(out + (k - k0) * NW + h * VL, vadd(vmul(vld_i8(q + k * NW + h * VL), s[h]), mi[h]));
    }
}

/* ---- float32 weights in the panel order: [N / NW][K][NW], the layout the GEMM micro-kernel reads, so
   panel_gemm multiplies the weight in place (the plain order's GEMM copies and transposes every panel).
   It serves every row count: at one row it streams the weight faster than the plain order's decode kernel
   (all linears of SmolLM2-135M on Zen 4: 16.7 against 19.8 ms; a panel decode kernel took 17.1). ---- */

/* ---- bfloat16 weights in the panel order, for --dtype bfloat16: [N / NW][K / 2][NW] 32-bit words, word c
   of k-pair j = bf16(w[row c][2j]) | bf16(w[row c][2j + 1]) << 16, the operand layout of AVX512-BF16's
   vdpbf16ps (two products per float lane). Activations are rounded to bfloat16 the same way, once per
   call; products are accumulated in float32. Where the CPU has no BF16 instructions the same words are
   widened to float32 (a shift) and multiplied with FMAs: the same products, summed in the same order
   (the odd k, then the even one, as vdpbf16ps specifies). Half the bytes of float32 per weight, and on
   BF16 hardware twice the products per instruction. ---- */

static inline uint32_t float_to_bf16(const float f) {
    /* round to nearest even, as vcvtne2ps2bf16 does (no NaNs reach here) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

static inline uint32_t bf16_pair(const float lo, const float hi) {
    return float_to_bf16(lo) | (float_to_bf16(hi) << 16);
}

/* one activation row rounded to bfloat16 pairs (xb: K / 2 words); AVX512-BF16 rounds 32 at a time */
static inline void bf16_row_pairs(const float* restrict x, const int64_t K, uint32_t* restrict xb) {
    int64_t k = 0;
#if defined(__AVX512BF16__) && VL == 16
    for (; k + 32 <= K; k += 32) /* lanes 0-15 from x[k..], 16-31 from x[k + 16..]: memory order */
        _mm512_storeu_si512(xb + k / 2,
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k)));
#endif
    for (; k < K; k += 2) xb[k / 2] = bf16_pair(x[k], x[k + 1]);
}

static inline float bits_to_float(const uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline __attribute__((always_inline)) V bf16_dot(V acc, const uint32_t xw, const VU w) {
#if defined(__AVX512BF16__) && VL == 16
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)xw), (__m512bh)w);
#else
    acc = vfma(vset1(bits_to_float(xw & 0xffff0000u)), (V)(w & 0xffff0000u), acc); /* the odd k */
    return vfma(vset1(bits_to_float(xw << 16)), (V)(w << 16), acc); /* the even k */
#endif
}

/* y[m][0:NW] (+)= xb[m] . panel for MRC rows over kp k-pairs from the chunk at w ([kp][NW] words) */
static inline __attribute__((always_inline)) void bf16_tile(const uint32_t* restrict xb, const int64_t K2,
                                                            const uint32_t* restrict w, const int64_t kp,
                                                            const int MRC, float* restrict y, const int64_t ldy,
                                                            const int first, const int64_t nw) {
    V acc[MR][2];
    UNROLL for (int m = 0; m < MRC; m++) acc[m][0] = acc[m][1] = vzero();
    for (int64_t k = 0; k < kp; k++) {
        VU w0, w1;
        memcpy(&w0, w + k * NW, sizeof w0);
        memcpy(&w1, w + k * NW + VL, sizeof w1);
        UNROLL for (int m = 0; m < MRC; m++) {
            const uint32_t xw = xb[m * K2 + k];
            acc[m][0] = bf16_dot(acc[m][0], xw, w0);
            acc[m][1] = bf16_dot(acc[m][1], xw, w1);
        }
    }
    tile_store(acc, MRC, y, ldy, first, nw);
}

/* Activation rows per block of the GEMMs: every panel re-reads all rows' activations, so at long prefills
   (1,500 rows: 3.4-9.2 MB for SmolLM2's K) they streamed from L3 and the Q4_1 GEMM fell from 260 to 223
   GFLOP/s (Xeon, 2 MB L2). Blocks of rows whose activations fill half of L2 stay there across panels. Each
   block dequantizes the panels again, so a block is never fewer than 8 row tiles; each output still sums
   its k in the same order, so results are bit for bit those of one block. */
static int64_t rows_per_block(const int64_t row_bytes) {
    static int64_t l2 = 0;
    if (l2 == 0) {
        const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
        l2 = v > 0 ? v : 512 * 1024; /* Zen 3's, where the C library cannot tell */
    }
    const int64_t rows = l2 / 2 / row_bytes / MR * MR;
    return rows < 8 * MR ? 8 * MR : rows;
}

/* A dequantized chunk [kc][NW] rounded to bfloat16 k-pair words [kc / 2][NW], the bfloat16 panel order's
   (rounded to nearest even, as bf16_row_pairs rounds the activations; kc even) */
static inline void bf16_chunk_pairs(const float* restrict buf, const int64_t kc, uint32_t* restrict wb) {
    for (int64_t j = 0; j < kc / 2; j++)
        UNROLL for (int h = 0; h < 2; h++) {
            VU lo, hi;
            memcpy(&lo, buf + 2 * j * NW + h * VL, sizeof lo);
            memcpy(&hi, buf + (2 * j + 1) * NW + h * VL, sizeof hi);
            lo += 0x7fffu + ((lo >> 16) & 1u);
            hi += 0x7fffu + ((hi >> 16) & 1u);
            const VU word = (lo >> 16) | (hi & 0xffff0000u);
            memcpy(wb + j * NW + h * VL, &word, sizeof word);
        }
}

/* The panel orders' GEMM: q4 (`kind` QW_Q4_PANEL, pairs of VL-wide panels), q8, float32 or bfloat16
   (QW_Q8_PANEL, QW_F32_PANEL, QW_BF16_PANEL, NW-wide). `bf16` (always for bfloat16 weights; for q4 and q8 under
   --dtype bfloat16): the activations are rounded to bfloat16 pairs once per call and bf16_tile multiplies them
   by the bfloat16 weights in place, or by each dequantized chunk rounded to bfloat16 as the bfloat16 panel
   order holds weights, so codes give the bfloat16 weights' products bit for bit from a quarter of the bytes.
   Returns -1 when the rounded activations' buffer could not be allocated. */
static int panel_gemm(int kind, const void* codes, const void* scales, const void* mins, int f16, int64_t g,
                      const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                      int nthreads, int bf16) {
    const int64_t panels = N / VL, G = K / g, K2 = K / 2;
    const int64_t MC = rows_per_block(K * (int64_t)(bf16 ? sizeof(uint16_t) : sizeof(float)));
    const size_t ss = f16 ? 2 : 4;
    uint32_t* xb = NULL;
    if (bf16 && (xb = malloc(sizeof(uint32_t) * M * K2)) == NULL) return -1;
#pragma omp parallel num_threads(nthreads)
    {
        if (bf16) {
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) bf16_row_pairs(x + m * ldx, K, xb + m * K2);
        }
        for (int64_t mc0 = 0; mc0 < M; mc0 += MC) { /* blocks of activation rows that stay in L2 */
            const int64_t mc1 = M - mc0 < MC ? M : mc0 + MC;
#pragma omp for schedule(static)
            for (int64_t pp = 0; pp < (panels + 1) / 2; pp++) { /* pairs of VL-wide panels (the last may be single) */
                float buf[KC * NW] __attribute__((aligned(64)));
                uint32_t wbuf[KC / 2 * NW] __attribute__((aligned(64)));
                const float* w = buf;
                const uint32_t* wb = wbuf;
                const int64_t p = 2 * pp, np = panels - p < 2 ? 1 : 2, nw = np * VL;
                const void* sc = scales ? (const char*)scales + p * G * VL * ss : 0;
                const void* mn = mins ? (const char*)mins + p * G * VL * ss : 0;
                if (np == 1) memset(buf, 0, sizeof buf);
                for (int64_t k0 = 0; k0 < K; k0 += KC) {
                    const int64_t kc = K - k0 < KC ? K - k0 : KC;
                    if (kind == QW_Q4_PANEL)
                        dequant_panels((const uint8_t*)codes + p * VL * (K / 2), sc, mn, f16, g, G, K, np, k0, kc,
                                       buf);
                    else if (kind == QW_Q8_PANEL) /* N % NW == 0, so np == 2 */
                        dequant_q8_panel((const int8_t*)codes + p * VL * K, sc, mn, f16, g, k0, kc, buf);
                    else if (kind == QW_BF16_PANEL) /* the weight itself, [kc / 2][NW] words from k0 */
                        wb = (const uint32_t*)codes + p * VL * K2 + k0 / 2 * NW;
                    else /* float32: the weight itself, [kc][NW] from k0 */
                        w = (const float*)codes + p * VL * K + k0 * NW;
                    if (bf16 && kind != QW_BF16_PANEL) bf16_chunk_pairs(buf, kc, wbuf);
                    for (int64_t m0 = mc0; m0 < mc1; m0 += MR) {
                        const float* xm = x + m0 * ldx + k0;
                        const uint32_t* xbm = bf16 ? xb + m0 * K2 + k0 / 2 : NULL;
                        float* ym = y + m0 * ldy + p * VL;
                        switch (mc1 - m0 < MR ? mc1 - m0 : MR) {
#define TILE(a) if (bf16) bf16_tile(xbm, K2, wb, kc / 2, a, ym, ldy, k0 == 0, nw); \
                else gemm_tile(xm, ldx, w, kc, a, ym, ldy, k0 == 0, nw)
#define T(a) case a: TILE(a); break
#if MR == 8
                            T(8); T(7);
#endif
                            T(6); T(5); T(4); T(3); T(2); default: TILE(1);
#undef T
#undef TILE
                        }
                    }
                }
            }
        }
    }
    free(xb);
    return 0;
}

/* ---- AMX: float32-accurate GEMMs on the tile unit, from split bfloat16 operands ----
   Where the CPU has AMX-BF16 (Intel Xeon from Sapphire Rapids on), one TDPBF16PS multiplies a 16 x 32
   bfloat16 tile by a 32 x 16 one into 16 x 16 float32 sums: ~15x the products per cycle of AVX-512 FMAs.
   bfloat16 alone would cost float32's accuracy, so each operand is split into bfloat16 parts whose sum is
   the float32 value: x = x0 + x1 + x2 (24 significant bits: every float32 of bfloat16's range exactly) and
   w = w0 + w1 + w2 (the dequantized Q4_1 weights of the default model need only w0 + w1). The products
   kept are those at or above float32's rounding: x0w0, x0w1, x1w0, x1w1, x2w0, and x0w2 where w2 is not
   zero. Each is exact in float32 and the tile unit adds it with float32 rounding, so a result differs from
   the float32 GEMM's by about the same rounding as two float32 summation orders differ (the dropped
   products are below 2^-24 of |x w|). Five or six tile products per 16 x 16 x 32 block, splits included,
   still ran SmolLM2's linears at 1,500 rows ~1.5x faster than the AVX-512 GEMM (docs/PERFORMANCE.md,
   item 34).

   Operands are split once per call into tiles of 1 KB, kept in one scratch buffer: activations as
   [M / 16][K / 32][part][16 rows][32 k], weights as [N / 16][K / 32][part][16 k-pairs][16 columns x 2],
   the operand layouts of TDPBF16PS. Weights are split from the float32 panel chunk every other GEMM
   multiplies (dequantized q4/q8 or float32 in place), in chunks of columns so the scratch stays small
   (the LM head's 49,152 columns included). */
#ifdef HAVE_AMX
#include <omp.h>
#include <pthread.h>
#include <sys/mman.h>
#define TILE_ELEMS 512            /* bfloat16 per tile: 16 rows of 64 bytes */
#define PART_STRIDE TILE_ELEMS    /* the parts of one tile block are adjacent */
#define BLOCK_ELEMS (3 * TILE_ELEMS)

int amx_usable(void) { return amx_granted(); }

/* x rounded to bfloat16 (nearest, ties to even), as a float32 with its low 16 bits zero */
static inline __m512 round_bf16(const __m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* x = p[0] + p[1] + p[2], each a bfloat16 value held as float32 */
static inline void split3(const __m512 x, __m512* p) {
    p[0] = round_bf16(x);
    const __m512 r = _mm512_sub_ps(x, p[0]);
    p[1] = round_bf16(r);
    p[2] = round_bf16(_mm512_sub_ps(r, p[1]));
}

static inline __m256i bf16_bits(const __m512 p) { /* 16 bfloat16 values */
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(p), 16));
}

/* activation rows [m0, m1) -> their split tiles (rows past M and k past K zero) */
static void split_rows(const float* x, const int64_t ldx, const int64_t M, const int64_t K, const int64_t Kb,
                       const int64_t m0, const int64_t m1, uint16_t* A) {
    for (int64_t m = m0; m < m1; m++)
        for (int64_t kb = 0; kb < Kb; kb++)
            for (int half = 0; half < 2; half++) {
                const int64_t k = kb * 32 + half * 16;
                const __m512 v = m < M && k < K ? _mm512_loadu_ps(x + m * ldx + k) : _mm512_setzero_ps();
                __m512 p[3];
                split3(v, p);
                uint16_t* t = A + ((m / 16) * Kb + kb) * BLOCK_ELEMS + (m % 16) * 32 + half * 16;
                for (int i = 0; i < 3; i++) _mm256_storeu_si256((__m256i*)(t + i * PART_STRIDE), bf16_bits(p[i]));
            }
}

/* A float32 panel chunk [kc][NW] (k from k0, kc even) -> the split tiles of its nh column tiles of 16 at B
   (B: the first of them, [K / 32][part] blocks each); returns whether any third weight part is nonzero.
   Each part is what the parts before it left, rounded: the parts of split3, 32 weights a conversion. */
static int split_panel(const float* w, const int64_t k0, const int64_t kc, const int nh, const int64_t Kb,
                       uint16_t* B) {
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    __m512i any = _mm512_setzero_si512();
    for (int h = 0; h < nh; h++)
        for (int64_t j = 0; j < kc / 2; j++) {
            __m512 e = _mm512_loadu_ps(w + 2 * j * NW + h * 16), o = _mm512_loadu_ps(w + (2 * j + 1) * NW + h * 16);
            const int64_t jj = k0 / 2 + j; /* k-pair within the weight */
            uint16_t* t = B + (h * Kb + jj / 16) * BLOCK_ELEMS + (jj % 16) * 32;
            for (int i = 0; i < 3; i++) {
                const __m512i word = pair_words(e, o);
                _mm512_storeu_si512(t + i * PART_STRIDE, word);
                if (i == 2) {
                    any = _mm512_or_si512(any, word);
                } else { /* exact: what this part left */
                    e = _mm512_sub_ps(e, _mm512_castsi512_ps(_mm512_slli_epi32(word, 16)));
                    o = _mm512_sub_ps(o, _mm512_castsi512_ps(_mm512_and_si512(word, high)));
                }
            }
        }
    return _mm512_test_epi32_mask(any, any) != 0;
}

/* Tiles: 0, 1 the x0w0 sums of two column tiles; 2, 3 the smaller products' (a separate sum, so adding them
   costs the large one no roundings: its error stays the float32 GEMM's); 4, 5 two parts of the row tile;
   6, 7 one weight part of each column tile. Each small sum takes four products per k-block, one after the
   other: the two column tiles' products alternate so one waits out the other's latency, not its own. */
static void amx_tile_pair(const uint16_t* A, const uint16_t* B0, const uint16_t* B1, const int64_t Kb,
                          const int third, float* y, const int64_t ldy, const int64_t rows, const int two) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t kb = 0; kb < Kb; kb++) {
        const uint16_t *a = A + kb * BLOCK_ELEMS, *b0 = B0 + kb * BLOCK_ELEMS, *b1 = B1 + kb * BLOCK_ELEMS;
        _tile_loadd(4, a, 64);                                   /* x0 */
        _tile_loadd(5, a + PART_STRIDE, 64);                     /* x1 */
        _tile_loadd(6, b0, 64);                                  /* w0 */
        if (two) _tile_loadd(7, b1, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two) _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        if (two) _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(4, a + 2 * PART_STRIDE, 64);                 /* x2 */
        _tile_dpbf16ps(2, 4, 6);
        if (two) _tile_dpbf16ps(3, 4, 7);
        _tile_loadd(6, b0 + PART_STRIDE, 64);                    /* w1 */
        if (two) _tile_loadd(7, b1 + PART_STRIDE, 64);
        _tile_dpbf16ps(2, 5, 6);
        if (two) _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(4, a, 64);                                   /* x0 again */
        _tile_dpbf16ps(2, 4, 6);
        if (two) _tile_dpbf16ps(3, 4, 7);
        if (third) {                                             /* w2, where nonzero */
            _tile_loadd(6, b0 + 2 * PART_STRIDE, 64);
            if (two) _tile_loadd(7, b1 + 2 * PART_STRIDE, 64);
            _tile_dpbf16ps(2, 4, 6);
            if (two) _tile_dpbf16ps(3, 4, 7);
        }
    }
    float c[4][16 * 16] __attribute__((aligned(64)));
    _tile_stored(0, c[0], 64);
    _tile_stored(2, c[2], 64);
    if (two) { _tile_stored(1, c[1], 64); _tile_stored(3, c[3], 64); }
    for (int64_t r = 0; r < rows; r++)
        for (int h = 0; h <= two; h++)
            _mm512_storeu_ps(y + r * ldy + h * 16, _mm512_add_ps(_mm512_load_ps(c[h] + r * 16),
                                                                  _mm512_load_ps(c[2 + h] + r * 16)));
}

static pthread_mutex_t amx_lock = PTHREAD_MUTEX_INITIALIZER;
static uint16_t* amx_scratch;
static size_t amx_scratch_elems;

/* The scratch of one call, grown as needed and kept (2 MiB-aligned, advised for huge pages: its tiles are
   read in runs a 4 KiB page's TLB entry would cut short) */
static uint16_t* amx_scratch_for(const size_t elems) {
    if (elems > amx_scratch_elems) {
        free(amx_scratch);
        const size_t huge = 2u << 20, bytes = (elems * 2 + huge - 1) & ~(huge - 1);
        amx_scratch = aligned_alloc(huge, bytes);
        if (amx_scratch) madvise(amx_scratch, bytes, MADV_HUGEPAGE);
        amx_scratch_elems = amx_scratch ? elems : 0;
    }
    return amx_scratch;
}

/* A float32 panel pair (VL-wide panels p and p + 1, or p alone) split into its tiles at B; returns whether
   a third weight part is nonzero */
static int split_pair(int kind, const void* codes, const void* scales, const void* mins, int f16, int64_t g,
                      int64_t N, int64_t K, int64_t p, uint16_t* B) {
    float buf[KC * NW] __attribute__((aligned(64)));
    const int64_t Kb = (K + 31) / 32, G = K / g, panels = N / VL;
    const int np = panels - p < 2 ? 1 : 2;
    const size_t ss = f16 ? 2 : 4;
    const void* sc = scales ? (const char*)scales + p * G * VL * ss : 0;
    const void* mn = mins ? (const char*)mins + p * G * VL * ss : 0;
    int any = 0;
    for (int64_t k0 = 0; k0 < Kb * 32; k0 += KC) {
        const int64_t kc = Kb * 32 - k0 < KC ? Kb * 32 - k0 : KC, real = K - k0 < kc ? K - k0 : kc;
        const float* w = buf;
        if (kind == QW_Q4_PANEL)
            dequant_panels((const uint8_t*)codes + p * VL * (K / 2), sc, mn, f16, g, G, K, np, k0, real, buf);
        else if (kind == QW_Q8_PANEL)
            dequant_q8_panel((const int8_t*)codes + p * VL * K, sc, mn, f16, g, k0, real, buf);
        else if (real == kc)
            w = (const float*)codes + p * VL * K + k0 * NW;
        else
            memcpy(buf, (const float*)codes + p * VL * K + k0 * NW, real * NW * sizeof(float));
        if (real < kc) memset(buf + real * NW, 0, (kc - real) * NW * sizeof(float));
        any |= split_panel(w, k0, kc, np, Kb, B);
    }
    return any;
}

#define AMX_B_BYTES (1 << 20) /* a thread's split weights at a time: they stay in its L2 across row blocks */
/* A block of split activation rows, read by every column pair of a group. 256 KB rather than 512 leaves L2 to
   the group's weights: SmolLM2's four Q4_1 linears 6-8% faster at 256-1,500 rows (item 44); the bfloat16
   GEMM's blocks measured the same either way. */
#define AMX_A_BYTES (256 << 10)
/* Groups of column pairs per thread at least, taken one at a time. A core's tile unit can run at half rate
   for seconds at a time, each core on its own (on the cloud Xeon measured, likely another tenant on its SMT
   sibling), so two threads' rates can differ 2x: with contiguous halves the fast one waited for the slow
   one (docs/PERFORMANCE.md, item 43). */
#define AMX_GROUPS_PER_THREAD 3

/* How many of `items` a turn takes so that each thread has AMX_GROUPS_PER_THREAD turns or more (at least 1) */
static inline int64_t amx_turn_size(const int64_t items, const int nthreads) {
    const int64_t n = items / (AMX_GROUPS_PER_THREAD * nthreads);
    return n > 1 ? n : 1;
}

/* The panel orders' GEMM (as panel_gemm) on the tile unit. Threads take groups of column pairs in turn, split
   a group's weights into their own scratch, sized to stay in L2, then multiply them with every block of rows:
   nothing is shared but the split activations, so no barrier after theirs. Each output is one thread's, in
   the same order whichever thread: results do not depend on the schedule. Returns -1 (nothing written) when
   the scratch could not be allocated. */
static int amx_panel_gemm(int kind, const void* codes, const void* scales, const void* mins, int f16, int64_t g,
                          const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                          int nthreads) {
    const int64_t Kb = (K + 31) / 32, Mt = (M + 15) / 16, tiles = N / 16, pairs = (tiles + 1) / 2;
    const int64_t pair_elems = 2 * Kb * BLOCK_ELEMS, a_elems = Mt * Kb * BLOCK_ELEMS;
    const int64_t fit = AMX_B_BYTES / (2 * pair_elems) > 1 ? AMX_B_BYTES / (2 * pair_elems) : 1;
    const int64_t share = amx_turn_size(pairs, nthreads), group = share < fit ? share : fit;
    const int64_t row_tiles = AMX_A_BYTES / (2 * Kb * BLOCK_ELEMS) > 1 ? AMX_A_BYTES / (2 * Kb * BLOCK_ELEMS) : 1;
    pthread_mutex_lock(&amx_lock);
    uint16_t* scratch = amx_scratch_for((size_t)a_elems + (size_t)nthreads * group * pair_elems);
    if (!scratch) { pthread_mutex_unlock(&amx_lock); return -1; }
    uint16_t* A = scratch;
    int64_t taken = 0; /* groups handed out */
#pragma omp parallel num_threads(nthreads)
    {
        amx_configure();
#pragma omp for schedule(dynamic, 1)
        for (int64_t mt = 0; mt < Mt; mt++) split_rows(x, ldx, M, K, Kb, mt * 16, mt * 16 + 16, A);
        uint16_t* B = scratch + a_elems + omp_get_thread_num() * group * pair_elems;
        int third[AMX_B_BYTES / (4 * BLOCK_ELEMS) + 1]; /* group <= this: a pair is >= 2 blocks of 2 bytes */
        for (;;) {
            int64_t g0;
#pragma omp atomic capture
            g0 = taken++;
            g0 *= group;
            if (g0 >= pairs) break;
            const int64_t g1 = pairs - g0 < group ? pairs : g0 + group;
            for (int64_t pp = g0; pp < g1; pp++)
                third[pp - g0] = split_pair(kind, codes, scales, mins, f16, g, N, K, 2 * pp,
                                            B + (pp - g0) * pair_elems);
            for (int64_t mb = 0; mb < Mt; mb += row_tiles) {
                const int64_t mb1 = Mt - mb < row_tiles ? Mt : mb + row_tiles;
                for (int64_t pp = g0; pp < g1; pp++) {
                    const uint16_t* B0 = B + (pp - g0) * pair_elems;
                    const int two = 2 * pp + 1 < tiles;
                    for (int64_t mt = mb; mt < mb1; mt++) {
                        const int64_t rows = M - mt * 16 < 16 ? M - mt * 16 : 16;
                        amx_tile_pair(A + mt * Kb * BLOCK_ELEMS, B0, B0 + Kb * BLOCK_ELEMS, Kb, third[pp - g0],
                                      y + mt * 16 * ldy + 32 * pp, ldy, rows, two);
                    }
                }
            }
        }
        _tile_release();
    }
    pthread_mutex_unlock(&amx_lock);
    return 0;
}
/* --dtype bfloat16 on the tile unit: the weights' panel order ([N / NW][K / 2][NW] words, a k-pair's NW
   columns side by side) is TDPBF16PS's B operand as it is (a tile: 16 k-pairs x 16 columns, rows NW words
   apart); the activations, rounded to bfloat16, are cut into A tiles ([M / 16][K / 32] tiles of 1 KB). One
   product per tile, the same products the AVX-512 kernel takes (bfloat16 operands, float32 sums), 32 x 32
   outputs at a time. Threads take chunks of panels in turn and multiply them with a block of row
   tiles at a time that stays in its L2: the whole activation read from L3 for every panel ran at a third
   of the rate (K = 1536). K a multiple of 32. Returns -1 (nothing written) when the scratch could not be
   allocated. */
static int amx_bf16_gemm(const uint32_t* wq, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                         int64_t N, int64_t K, int nthreads) {
    const int64_t Kb = K / 32, Mt = (M + 15) / 16, panels = N / NW, tile_words = 256;
    const int64_t block = AMX_A_BYTES / (Kb * 1024) > 2 ? AMX_A_BYTES / (Kb * 1024) / 2 * 2 : 2; /* row tiles */
    pthread_mutex_lock(&amx_lock);
    uint32_t* xa = (uint32_t*)amx_scratch_for((size_t)Mt * 16 * K);
    if (!xa) { pthread_mutex_unlock(&amx_lock); return -1; }
#pragma omp parallel num_threads(nthreads)
    {
        amx_configure();
#pragma omp for schedule(static)
        for (int64_t m = 0; m < Mt * 16; m++) { /* row m: word j of k-tile kb at tile (m / 16, kb), row m % 16 */
            uint32_t row[16];
            for (int64_t kb = 0; kb < Kb; kb++) {
                if (m < M) bf16_row_pairs(x + m * ldx + kb * 32, 32, row);
                else memset(row, 0, sizeof row);
                memcpy(xa + ((m / 16) * Kb + kb) * tile_words + (m % 16) * 16, row, sizeof row);
            }
        }
        const int64_t chunk = amx_turn_size(panels, nthreads);
        for (int64_t mb = 0; mb < Mt; mb += block) {
            const int64_t mb1 = Mt - mb < block ? Mt : mb + block;
#pragma omp for schedule(dynamic, chunk) nowait /* as amx_panel_gemm: the tile units' rates differ */
            for (int64_t p = 0; p < panels; p++) {
                const uint32_t* wp = wq + p * (K / 2) * NW;
                for (int64_t mt = mb; mt < mb1; mt += 2) {
                    const int two = mt + 1 < mb1;
                    const uint32_t* a = xa + mt * Kb * tile_words;
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                    for (int64_t kb = 0; kb < Kb; kb++) {
                        _tile_loadd(4, a + kb * tile_words, 64);
                        _tile_loadd(6, wp + kb * 16 * NW, NW * 4);
                        _tile_loadd(7, wp + kb * 16 * NW + 16, NW * 4);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(1, 4, 7);
                        if (two) {
                            _tile_loadd(5, a + (Kb + kb) * tile_words, 64);
                            _tile_dpbf16ps(2, 5, 6);
                            _tile_dpbf16ps(3, 5, 7);
                        }
                    }
                    float c[4][16 * 16] __attribute__((aligned(64)));
                    _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64);
                    _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64);
                    for (int64_t r = 0; r < 32 && mt * 16 + r < M; r++)
                        for (int h = 0; h < 2; h++)
                            memcpy(y + (mt * 16 + r) * ldy + p * NW + h * 16, c[(r / 16) * 2 + h] + (r % 16) * 16,
                                   64);
                }
            }
        }
        _tile_release();
    }
    pthread_mutex_unlock(&amx_lock);
    return 0;
}

/* q4 panel codes at decode rows (up to 16: one row tile) on the tile unit, the codes as the weight operand:
   a 4-bit code is exact in bfloat16, so per group x . w = d (x . q) + m sum(x), x split in three exact parts
   (float32's 24 bits) and three products per output tile and k-block of 32. A k-block's tile sums are stored
   and scaled by d (and m sum(x)) in AVX-512 while the next block's products run. The codes become B tiles per
   call, 4 k-pairs of a panel vector at a time: a k-pair's two nibbles of each column moved into the two words
   of a lane, then their bfloat16 values by a 32-word table (VPERMW reads an index's low 5 bits). Threads take
   groups of Q4D_TILES column tiles in turn (the tile units' rates differ per core: item 43). Needs the panel
   width of 16 and groups a multiple of 32. Against the AVX-512 decode kernel (SmolLM2's layer linears, 2
   threads): 1.3-1.7x at 15-16 rows, level at 12-13 (AMX_Q4_ROWS_MIN).
   Returns -1 (nothing written) when the scratch could not be allocated. */
#define Q4D_TILES 3
static inline void q4_codes_tile(const uint32_t* w, uint16_t* b, const __m512i table) {
    for (int v = 0; v < 4; v++) { /* 8 k of 16 columns: nibble i of word j = code(column j, k + i) */
        const __m512i word = _mm512_loadu_si512(w + v * 16);
        for (int p = 0; p < 4; p++) {
            const __m512i t = _mm512_and_si512(_mm512_srli_epi32(word, 8 * p), _mm512_set1_epi32(255));
            _mm512_store_si512((__m512i*)(b + (v * 4 + p) * 32),
                               _mm512_permutexvar_epi16(_mm512_or_si512(t, _mm512_slli_epi32(t, 12)), table));
        }
    }
}

static int amx_q4_rows(const uint8_t* codes, const void* scales, const void* mins, int f16, int64_t g,
                       const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                       int nthreads) {
    const int64_t Kb = K / 32, G = K / g, per_group = g / 32, tiles = N / 16;
    const int64_t turns = (tiles + Q4D_TILES - 1) / Q4D_TILES;
    pthread_mutex_lock(&amx_lock);
    uint16_t* A = amx_scratch_for((size_t)Kb * BLOCK_ELEMS + Kb * 16 * 2);
    if (!A) { pthread_mutex_unlock(&amx_lock); return -1; }
    float* sx = (float*)(A + Kb * BLOCK_ELEMS); /* [Kb][16]: each row's sum over a k-block */
    for (int64_t m = 0; m < 16; m++)
        for (int64_t kb = 0; kb < Kb; kb++)
            sx[kb * 16 + m] = m < M ? _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(x + m * ldx + kb * 32),
                                                                          _mm512_loadu_ps(x + m * ldx + kb * 32 + 16)))
                                    : 0.f;
    split_rows(x, ldx, M, K, Kb, 0, 16, A);
#pragma omp parallel num_threads(nthreads)
    {
        amx_configure();
        uint16_t table_words[32];
        for (int i = 0; i < 32; i++) {
            const float f = (float)(i & 15);
            uint32_t u;
            memcpy(&u, &f, 4);
            table_words[i] = (uint16_t)(u >> 16);
        }
        const __m512i table = _mm512_loadu_si512(table_words);
        uint16_t B[2][Q4D_TILES][TILE_ELEMS] __attribute__((aligned(64)));
        float c[2][Q4D_TILES][256] __attribute__((aligned(64)));
        float acc[16][Q4D_TILES * 16] __attribute__((aligned(64)));
#pragma omp for schedule(dynamic, 1)
        for (int64_t turn = 0; turn < turns; turn++) {
            const int64_t t0 = turn * Q4D_TILES, nt = tiles - t0 < Q4D_TILES ? tiles - t0 : Q4D_TILES;
            const uint8_t* panel = codes + t0 * 8 * K; /* 16 columns x K / 2 bytes a panel */
            memset(acc, 0, sizeof acc);
            for (int64_t j = 0; j < nt; j++) q4_codes_tile((const uint32_t*)(panel + j * 8 * K), B[0][j], table);
            for (int64_t kb = 0; kb <= Kb; kb++) {
                if (kb < Kb) { /* this block's products; the next block's codes expanded meanwhile */
                    const uint16_t* a = A + kb * BLOCK_ELEMS;
                    _tile_zero(0); _tile_zero(1); _tile_zero(2);
                    _tile_loadd(5, B[kb & 1][0], 64);
                    if (nt > 1) _tile_loadd(6, B[kb & 1][1], 64);
                    if (nt > 2) _tile_loadd(7, B[kb & 1][2], 64);
                    _tile_loadd(3, a, 64);
                    _tile_loadd(4, a + PART_STRIDE, 64);
                    _tile_dpbf16ps(0, 3, 5);
                    if (nt > 1) _tile_dpbf16ps(1, 3, 6);
                    if (nt > 2) _tile_dpbf16ps(2, 3, 7);
                    _tile_loadd(3, a + 2 * PART_STRIDE, 64);
                    _tile_dpbf16ps(0, 4, 5);
                    if (nt > 1) _tile_dpbf16ps(1, 4, 6);
                    if (nt > 2) _tile_dpbf16ps(2, 4, 7);
                    _tile_dpbf16ps(0, 3, 5);
                    if (nt > 1) _tile_dpbf16ps(1, 3, 6);
                    if (nt > 2) _tile_dpbf16ps(2, 3, 7);
                    if (kb + 1 < Kb)
                        for (int64_t j = 0; j < nt; j++)
                            q4_codes_tile((const uint32_t*)(panel + j * 8 * K + (kb + 1) * 256), B[(kb + 1) & 1][j],
                                          table);
                }
                if (kb > 0) { /* the previous block's sums, scaled */
                    const int64_t pk = kb - 1;
                    for (int64_t j = 0; j < nt; j++) {
                        const int64_t at = ((t0 + j) * G + pk / per_group) * 16;
                        const __m512 d = pscale(scales, f16, at), mn = pscale(mins, f16, at);
                        const float* cj = c[pk & 1][j];
                        for (int64_t r = 0; r < M; r++) {
                            __m512 o = _mm512_load_ps(acc[r] + j * 16);
                            o = _mm512_fmadd_ps(d, _mm512_load_ps(cj + r * 16), o);
                            o = _mm512_fmadd_ps(mn, _mm512_set1_ps(sx[pk * 16 + r]), o);
                            _mm512_store_ps(acc[r] + j * 16, o);
                        }
                    }
                }
                if (kb < Kb) {
                    _tile_stored(0, c[kb & 1][0], 64);
                    if (nt > 1) _tile_stored(1, c[kb & 1][1], 64);
                    if (nt > 2) _tile_stored(2, c[kb & 1][2], 64);
                }
            }
            for (int64_t r = 0; r < M; r++) memcpy(y + r * ldy + t0 * 16, acc[r], nt * 64);
        }
        _tile_release();
    }
    pthread_mutex_unlock(&amx_lock);
    return 0;
}
#else
int amx_usable(void) { return 0; }
#endif

/* ---- one entry for any weight: the decode kernel below gemm_min rows, the GEMM from there, then the bias.
   QuantLinear and the fused decode stack (tgi_llm/models/fused_decode.py) both call it. */
/* qweight_t: include/kernels.h */

/* Rows from which the panel orders' GEMMs run on the tile unit (0: never): float32 and quantized weights
   (split operands), bfloat16 weights (their own operand); set by QuantKernels where amx_usable() */
static int64_t amx_min_rows = 0, amx_bf16_min_rows = 0, amx_q4_rows_min = 0;
void set_amx_min_rows(int64_t rows, int64_t bf16_rows, int64_t q4_rows) {
    amx_min_rows = amx_usable() ? rows : 0;
    amx_bf16_min_rows = amx_usable() ? bf16_rows : 0;
    amx_q4_rows_min = amx_usable() ? q4_rows : 0;
}

/* A GEMM that could not allocate its buffer: NaN outputs, never a silent wrong answer */
static void poison(float* y, const int64_t ldy, const int64_t M, const int64_t N) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) y[m * ldy + n] = NAN;
}

void quant_apply(const qweight_t* w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                 int64_t gemm_min, int nthreads) {
    const int64_t N = w->N, K = w->K;
    if (w->kind == QW_BF16_PANEL) {
#ifdef HAVE_AMX
        if (!(amx_bf16_min_rows > 0 && M >= amx_bf16_min_rows && K % 32 == 0 &&
              amx_bf16_gemm((const uint32_t*)w->codes, x, ldx, y, ldy, M, N, K, nthreads) == 0))
#endif
        if (panel_gemm(QW_BF16_PANEL, w->codes, NULL, NULL, 0, K, x, ldx, y, ldy, M, N, K, nthreads, 1) != 0)
            poison(y, ldy, M, N);
    } else if (w->bf16_min_rows > 0 && M >= w->bf16_min_rows &&
               (w->kind == QW_Q4_PANEL || w->kind == QW_Q8_PANEL)) {
        if (panel_gemm(w->kind, w->codes, w->scales, w->mins, w->f16, w->group, x, ldx, y, ldy, M, N, K, nthreads,
                       1) != 0)
            poison(y, ldy, M, N);
    } else if (M < gemm_min && w->kind != QW_F32_PANEL) {
        switch (w->kind) {
#define Q4(fn) fn(w->codes, w->scales, w->mins, w->f16, w->group, x, ldx, y, ldy, M, N, K, nthreads)
        case QW_Q4_GGUF: Q4(q4_linear); break;
        case QW_Q4_X8: Q4(q4x8_linear); break;
        case QW_Q4_PANEL:
#ifdef HAVE_AMX
            if (amx_q4_rows_min > 0 && M >= amx_q4_rows_min && M <= 16 && w->group % 32 == 0 &&
                amx_q4_rows(w->codes, w->scales, w->mins, w->f16, w->group, x, ldx, y, ldy, M, N, K, nthreads) == 0)
                break;
#endif
            Q4(q4p_linear);
            break;
        case QW_Q8_PANEL: Q4(q8p_linear); break;
        case QW_F32: f32_linear(w->codes, x, ldx, y, ldy, M, N, K, nthreads); break;
        default: q8_linear(w->codes, w->scales, w->mins, w->f16, w->group, x, ldx, y, ldy, M, N, K, nthreads);
        }
    } else if (w->kind == QW_Q4_PANEL || w->kind == QW_Q8_PANEL || w->kind == QW_F32_PANEL) {
#ifdef HAVE_AMX
        if (!(amx_min_rows > 0 && M >= amx_min_rows &&
              amx_panel_gemm(w->kind, w->codes, w->scales, w->mins, w->f16, w->group, x, ldx, y, ldy, M, N, K,
                             nthreads) == 0))
#endif
        panel_gemm(w->kind, w->codes, w->scales, w->mins, w->f16, w->group, x, ldx, y, ldy, M, N, K, nthreads, 0);
#undef Q4
    } else {
        quant_gemm(w->kind, w->codes, w->scales, w->mins, w->f16, w->group, x, ldx, y, ldy, M, N, K, nthreads);
    }
    if (w->bias)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) y[m * ldy + n] += w->bias[n];
}
