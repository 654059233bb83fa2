/* A step's whole decoder layer stack in one call: the norms, rope, the K/V write, the SiLU gate and the
   residual adds here, the linears and attention through the kernels of quant/ and attention/. Built with
   -ffp-contract=off (tgi_llm/native/build.py): rope and the norms round like torch's separate ops. The
   Python side is tgi_llm/models/fused_decode.py. */
#include "kernels.h"
#include "vectors.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows from which the row loops below split over the threads: fewer (a decode step's) are not worth waking
   the others for. At a 1,500-token prefill these loops took 102 ms of 1,590 on one core. */
#define PAR_MIN_ROWS 128

/* as RMSNorm.forward: x * rsqrt(mean(x^2) + eps), then times the weight, for one row */
static void rmsnorm_row(const float* restrict x, const float* restrict w, float* restrict out, int64_t H,
                        float eps) {
    V acc = vzero();
    int64_t i = 0;
    for (; i + VL <= H; i += VL) acc = vfma(vld(x + i), vld(x + i), acc);
    float ss = vsum(acc);
    for (; i < H; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)H + eps);
    for (i = 0; i < H; i++) out[i] = w[i] * (x[i] * r);
}

static void rmsnorm(const float* restrict x, const float* restrict w, float* restrict out, int64_t M, int64_t H,
                    float eps, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M >= PAR_MIN_ROWS)
    for (int64_t m = 0; m < M; m++) rmsnorm_row(x + m * H, w, out + m * H, H, eps);
}

/* the residual add (h += d), then the next norm of the same rows while they are in L1 */
static void add_rmsnorm(float* restrict h, const float* restrict d, const float* restrict w, float* restrict out,
                        int64_t M, int64_t H, float eps, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M >= PAR_MIN_ROWS)
    for (int64_t m = 0; m < M; m++) {
        float* hm = h + m * H;
        const float* dm = d + m * H;
        for (int64_t i = 0; i < H; i++) hm[i] += dm[i];
        rmsnorm_row(hm, w, out + m * H, H, eps);
    }
}

/* x * cos + rotate_half(x) * sin, sin carrying rotate_half's sign (models/rope.py: rotary_tables); the two
   halves in their own loops, which vectorize */
static void rope_row(const float* restrict x, const float* restrict c, const float* restrict s, float* restrict out,
                     int64_t D) {
    const int64_t half = D / 2;
    for (int64_t d = 0; d < half; d++) {
        const float a = x[d] * c[d], b = x[d + half] * s[d];
        out[d] = a + b;
    }
    for (int64_t d = half; d < D; d++) {
        const float a = x[d] * c[d], b = x[d - half] * s[d];
        out[d] = a + b;
    }
}

/* y[:I] = silu(gate) * up for rows of gu = [gate | up] (2I wide) */
static void silu_mul(const float* restrict gu, float* restrict y, int64_t M, int64_t I, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M * I >= 32768)
    for (int64_t m = 0; m < M; m++) {
        const float *g = gu + m * 2 * I, *u = g + I;
        float* ym = y + m * I;
        int64_t i = 0;
        for (; i + VL <= I; i += VL) {
            const V x = vld(g + i);
            const VI neg = x < vzero();
            const V e = vexp(vblend(neg, x, vzero() - x)); /* exp(-|x|) */
            const V one = vset1(1.0f);
            const V sig = vblend(neg, e / (one + e), one / (one + e));
            vst(ym + i, vmul(vmul(x, sig), vld(u + i)));
        }
        for (; i < I; i++) ym[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* hidden [M, H]: the embedded tokens, updated in place through the layers; out [M, H]: after the final norm.
   cos/sin [M, D]; slots [M] int64. Rows [0, B) are decodes, one token each: tables rows [0, B) int32 [., W],
   seq_lens [B] int32 (after this token). Rows [B, M) are the prompt chunks of `prompts`.
   Returns 0, or -1 if scratch memory could not be had. */
int layer_stack(const layer_t* layers, int64_t L, const prompts_t* prompts, float* hidden, float* out,
                const float* final_norm, int64_t M, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I,
                const float* cos, const float* sin, const int64_t* slots, const int32_t* tables, int64_t W,
                int64_t B, const int32_t* seq_lens, int64_t BS, int64_t stride, float scale, float eps,
                int nthreads) {
    const int64_t QKV = (Hq + 2 * Hkv) * D, tok = Hkv * D;
    const size_t floats = M * (H + QKV + 2 * Hq * D + H + 2 * I + I) + B * Hq * stride;
    float* scratch = malloc(floats * sizeof(float));
    if (!scratch) return -1;
    float *normed = scratch, *qkv = normed + M * H, *q = qkv + M * QKV, *att = q + M * Hq * D,
          *proj = att + M * Hq * D, *gu = proj + M * H, *act = gu + M * 2 * I, *scores = act + M * I;
    rmsnorm(hidden, layers[0].input_norm, normed, M, H, eps, nthreads);
    for (int64_t l = 0; l < L; l++) {
        const layer_t* ly = layers + l;
        quant_apply(ly->qkv, normed, H, qkv, QKV, M, ly->gemm_min[0], nthreads);
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M >= PAR_MIN_ROWS)
        for (int64_t m = 0; m < M; m++) {
            const float *row = qkv + m * QKV, *c = cos + m * D, *s = sin + m * D;
            float* kdst = ly->k_cache + slots[m] * tok;
            for (int64_t h = 0; h < Hq; h++) rope_row(row + h * D, c, s, q + (m * Hq + h) * D, D);
            for (int64_t h = 0; h < Hkv; h++) rope_row(row + (Hq + h) * D, c, s, kdst + h * D, D);
            memcpy(ly->v_cache + slots[m] * tok, row + (Hq + Hkv) * D, tok * sizeof(float));
        }
        if (B)
            paged_decode_f32(q, ly->k_cache, ly->v_cache, tables, seq_lens, att, scores, B, Hq, Hkv, D, BS, W, stride,
                             scale, nthreads);
        if (prompts->S && prompts->run(q, Hq * D, att, ly->k_cache, ly->v_cache, tables, W, prompts->trow,
                                       prompts->qstart, prompts->qlen, prompts->klen, prompts->S, Hq, Hkv, D, BS,
                                       scale, nthreads)) {
            free(scratch);
            return -1;
        }
        quant_apply(ly->o, att, Hq * D, proj, H, M, ly->gemm_min[1], nthreads);
        add_rmsnorm(hidden, proj, ly->post_norm, normed, M, H, eps, nthreads);
        quant_apply(ly->gate_up, normed, H, gu, 2 * I, M, ly->gemm_min[2], nthreads);
        silu_mul(gu, act, M, I, nthreads);
        quant_apply(ly->down, act, I, proj, H, M, ly->gemm_min[3], nthreads);
        /* the next layer's input norm, or after the last layer the final one */
        const int last = l == L - 1;
        add_rmsnorm(hidden, proj, last ? final_norm : layers[l + 1].input_norm, last ? out : normed, M, H, eps,
                    nthreads);
    }
    free(scratch);
    return 0;
}
