/* Native-width float vectors for the C kernels.

   `V` holds VL float32 lanes: an AVX-512 or AVX2 register through intrinsics where -march=native has them
   (GCC keeps arrays of its generic vectors, and byte-to-float conversions of them, in memory: 10x slower
   there), a plain 8-lane GCC vector elsewhere, so every kernel also builds and runs on a CPU with neither.
   Kernels are written once against vld / vst / vfma / vset1 / vsum / vexp ... and get the widest vectors the
   CPU has. */
#ifndef TGI_VECTORS_H
#define TGI_VECTORS_H

#include <stdint.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* Native-width vectors through intrinsics (GCC keeps arrays of its generic vectors, and byte-to-float
   conversions of them, in memory: 10x slower here). A plain 8-lane GCC vector elsewhere. */
#if defined(__AVX512F__)
#define VL 16
typedef __m512 V;
#define vld(p) _mm512_loadu_ps(p)
#define vst(p, v) _mm512_storeu_ps(p, v)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vmul(a, b) _mm512_mul_ps(a, b)
#define vadd(a, b) _mm512_add_ps(a, b)
#define vset1(x) _mm512_set1_ps(x)
#define vzero() _mm512_setzero_ps()
static inline float vsum(V v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
#define VL 8
typedef __m256 V;
#define vld(p) _mm256_loadu_ps(p)
#define vst(p, v) _mm256_storeu_ps(p, v)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vmul(a, b) _mm256_mul_ps(a, b)
#define vadd(a, b) _mm256_add_ps(a, b)
#define vset1(x) _mm256_set1_ps(x)
#define vzero() _mm256_setzero_ps()
static inline float vsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#else
#define VL 8
typedef float V __attribute__((vector_size(32)));
static inline V vld(const float* p) { V v; memcpy(&v, p, sizeof v); return v; }
static inline void vst(float* p, V v) { memcpy(p, &v, sizeof v); }
#define vfma(a, b, c) ((a) * (b) + (c))
#define vmul(a, b) ((a) * (b))
#define vadd(a, b) ((a) + (b))
#define vset1(x) ((V){0} + (x))
#define vzero() ((V){0})
static inline float vsum(V v) { float s = 0.f; for (int i = 0; i < VL; i++) s += v[i]; return s; }
#endif

/* VL bfloat16 or float16 values from p as float32 lanes: the 16-bit K/V caches, converted in registers. A
   bfloat16 is a float32's top half; float16 takes F16C (AVX-512 has it), else GCC's _Float16 lane by lane. */
static inline V vld_bf16(const void* p) {
#if defined(__AVX512F__)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
#elif defined(__AVX2__) && defined(__FMA__)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
#else
    uint16_t h[VL];
    uint32_t w[VL];
    memcpy(h, p, sizeof h);
    for (int i = 0; i < VL; i++) w[i] = (uint32_t)h[i] << 16;
    V v;
    memcpy(&v, w, sizeof v);
    return v;
#endif
}

static inline V vld_f16(const void* p) {
#if defined(__AVX512F__)
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#else
    _Float16 h[VL];
    memcpy(h, p, sizeof h);
    V v;
    for (int i = 0; i < VL; i++) v[i] = (float)h[i];
    return v;
#endif
}

/* VL int8 codes from p as float32 lanes: the 8-bit K/V cache and the q8 weight panels, converted in registers */
static inline __attribute__((always_inline)) V vld_i8(const int8_t* p) {
#if defined(__AVX512F__)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
#elif defined(__AVX2__) && defined(__FMA__)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
#else
    V v;
    for (int i = 0; i < VL; i++) v[i] = (float)p[i];
    return v;
#endif
}

/* Fully unroll a short loop of constant trip count: register-blocked accumulators stay in registers. */
#define UNROLL _Pragma("GCC unroll 16")

/* The same vectors' lanes as int32, for masks and exponent bits (GCC vector extensions: comparisons of V
   give VI masks, casts between same-sized vectors reinterpret bits). */
typedef int32_t VI __attribute__((vector_size(VL * 4)));

static inline V vblend(VI m, V a, V b) { return (V)(((VI)a & m) | ((VI)b & ~m)); } /* m ? a : b per lane */
static inline V vmax(V a, V b) { return vblend(a > b, a, b); }
static inline float vhmax(V v) {
#if defined(__AVX512F__)
    return _mm512_reduce_max_ps(v);
#elif defined(__AVX2__) && defined(__FMA__)
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
#else
    float t[VL], m;
    vst(t, v);
    m = t[0];
    for (int i = 1; i < VL; i++) m = t[i] > m ? t[i] : m;
    return m;
#endif
}

/* exp on VL lanes for x <= 88 (Cephes expf, ~1 ulp; below -87 it returns ~1e-38, never 0). */
static inline V vexp(V x) {
    const V lo = vset1(-87.0f), magic = vset1(12582912.0f); /* 1.5 * 2^23: round to nearest */
    x = vblend(x < lo, lo, x);
    const V n = (x * 1.44269504088896341f + magic) - magic;
    const V r = x - n * 0.693359375f + n * 2.12194440e-4f;
    V p = vset1(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const VI e = (__builtin_convertvector(n, VI) + 127) << 23;
    return p * (V)e;
}

/* out[0..3] = the lane sums of a, b, c, d */
static inline void vsum4(V a, V b, V c, V d, float* out) {
#if defined(__AVX2__) && !defined(__AVX512F__)
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d), abcd = _mm256_hadd_ps(ab, cd);
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
#else
    out[0] = vsum(a), out[1] = vsum(b), out[2] = vsum(c), out[3] = vsum(d);
#endif
}

/* The lane sums of VL vectors as one vector (lane i: the sum of a[i]), by a transposing tree: ~2 shuffles
   and 1 add a sum where vsum takes 4 + 4 (the decode kernel's scores, VL keys at a time). */
static inline __attribute__((always_inline)) V vsum_lanes(const V* a) {
#if defined(__AVX512F__)
    /* the tree leaves lane 4k + j holding input 4j + k: inputs taken in that (self-inverse) order */
    V b[8], c[4], d[2];
    UNROLL for (int i = 0; i < 8; i++) {
        const V x = a[(2 * i) % 4 * 4 + (2 * i) / 4], y = a[(2 * i + 1) % 4 * 4 + (2 * i + 1) / 4];
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
    }
    UNROLL for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    UNROLL for (int i = 0; i < 2; i++)
        d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 lo = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 hi = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
#else
    V s;
    for (int i = 0; i < VL; i++) s[i] = vsum(a[i]);
    return s;
#endif
}

#endif /* TGI_VECTORS_H */
