/* A step's whole decoder layer stack in one call: the norms (before and after each block, q/k norms), rope,
   the K/V write, the SiLU or GELU gate and the residual adds here, the linears and attention through the kernels of quant/ and attention/. Built with
   -ffp-contract=off (tgi_llm/native/build.py): rope and the norms round like torch's separate ops. The
   Python side is tgi_llm/models/layer_stack.py. */
#include "experts.h"
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

/* out = the norm of x's rows (w NULL: x as it is) */
static void rmsnorm(const float* restrict x, const float* w, float* restrict out, int64_t M, int64_t H, float eps,
                    int nthreads) {
    if (!w) {
        memcpy(out, x, M * H * sizeof(float));
        return;
    }
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M >= PAR_MIN_ROWS)
    for (int64_t m = 0; m < M; m++) rmsnorm_row(x + m * H, w, out + m * H, H, eps);
}

/* rmsnorm_row where x may be out (its sum of squares is taken before any element is written) */
static void rmsnorm_inplace(float* x, const float* w, int64_t H, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < H; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)H + eps);
    for (int64_t i = 0; i < H; i++) x[i] = w[i] * (x[i] * r);
}

/* The end of a block, row by row while the rows are in L1: d through its output norm (if any, in place),
   times `scale`, added to h; then out = the next norm of h (NULL: h as it is) */
static void residual(float* restrict h, float* restrict d, const float* d_norm, float scale, const float* next_norm,
                     float* restrict out, int64_t M, int64_t H, float eps, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M >= PAR_MIN_ROWS)
    for (int64_t m = 0; m < M; m++) {
        float* hm = h + m * H;
        float* dm = d + m * H;
        if (d_norm) rmsnorm_inplace(dm, d_norm, H, eps);
        if (scale != 1.0f)
            for (int64_t i = 0; i < H; i++) hm[i] += dm[i] * scale;
        else
            for (int64_t i = 0; i < H; i++) hm[i] += dm[i];
        if (next_norm)
            rmsnorm_row(hm, next_norm, out + m * H, H, eps);
        else
            memcpy(out + m * H, hm, H * sizeof(float));
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

/* y[:I] = gelu(gate) * up, gelu in its tanh form (transformers' gelu_pytorch_tanh), for rows of gu */
static void gelu_tanh_mul(const float* restrict gu, float* restrict y, int64_t M, int64_t I, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M * I >= 32768)
    for (int64_t m = 0; m < M; m++) {
        const float *g = gu + m * 2 * I, *u = g + I;
        float* ym = y + m * I;
        for (int64_t i = 0; i < I; i++) {
            const float x = g[i];
            ym[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
        }
    }
}

/* a row's q (normalized per head or over the projection, then rotated) into q_out, and its K/V into the cache's
   token slot `slot` (of the layer's kv_dtype: rounded there from float32) */
static void qkv_row(const layer_t* ly, float* restrict row, const float* c, const float* s, float* restrict q_out,
                    int64_t slot, int64_t Hq, int64_t Hkv, int64_t D, float eps) {
    if (ly->q_norm && ly->qk_norm_per_head) {
        for (int64_t h = 0; h < Hq; h++) rmsnorm_inplace(row + h * D, ly->q_norm, D, eps);
        for (int64_t h = 0; h < Hkv; h++) rmsnorm_inplace(row + (Hq + h) * D, ly->k_norm, D, eps);
    } else if (ly->q_norm) {
        rmsnorm_inplace(row, ly->q_norm, Hq * D, eps);
        rmsnorm_inplace(row + Hq * D, ly->k_norm, Hkv * D, eps);
    }
    float k[Hkv * D];
    if (ly->rope == ROPE_NONE) {
        memcpy(q_out, row, Hq * D * sizeof(float));
        memcpy(k, row + Hq * D, Hkv * D * sizeof(float));
    } else {
        const int64_t R = ly->rope_dim; /* partial rotary (Phi-4-mini): the rest of the head passes as it is */
        for (int64_t h = 0; h < Hq + Hkv; h++) {
            float* dst = h < Hq ? q_out + h * D : k + (h - Hq) * D;
            rope_row(row + h * D, c, s, dst, R);
            memcpy(dst + R, row + h * D + R, (D - R) * sizeof(float));
        }
    }
    const int64_t tok = Hkv * D, at = slot * tok * kv_bytes(ly->kv_dtype); /* bytes */
    const int64_t group = ly->kv_dtype == KV_Q8 ? slot * tok / KV_Q8_GROUP : 0; /* the row's first scale */
    kv_store_row((char*)ly->k_cache + at, (_Float16*)ly->k_scales + group, k, tok, ly->kv_dtype);
    kv_store_row((char*)ly->v_cache + at, (_Float16*)ly->v_scales + group, row + (Hq + Hkv) * D, tok, ly->kv_dtype);
}

/* a linear's LoRA adapters on the rows that run one (lora_rows NULL: the step has none) */
static void adapters(const lora_t* w, const float* x, int64_t ldx, float* y, int64_t ldy, const int32_t* lora_rows,
                     int64_t M, int nthreads) {
    if (w && lora_rows) lora_apply(w, x, ldx, y, ldy, lora_rows, M, nthreads);
}

/* hidden [M, H]: the embedded tokens, updated in place through the layers; out [M, H]: after the final norm.
   I: the largest dense MLP's intermediate size (0: every layer has experts).
   cos/sin [M, rope_dim of the ROPE_GLOBAL layers] (cos_local/sin_local: of the ROPE_LOCAL ones); slots [M]
   int64. Rows [0, B) are decodes, one token each: tables rows [0, B) int32 [., W], seq_lens [B] int32 (after
   this token). Rows [B, M) are the prompt chunks of `prompts`. softcap > 0: decode
   scores soft-capped (Gemma 2; the caller sends no prompt chunks then: the prefill kernels do not cap).
   lora_rows [M]: each row's adapter slot (-1: the base model), or NULL when no row runs one.
   Returns 0, or -1 if scratch memory could not be had. */
int layer_stack(const layer_t* layers, int64_t L, const prompts_t* prompts, const int32_t* lora_rows, float* hidden, float* out,
                const float* final_norm, int64_t M, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I,
                const float* cos, const float* sin, const float* cos_local, const float* sin_local,
                const int64_t* slots, const int32_t* tables, int64_t W, int64_t B, const int32_t* seq_lens,
                int64_t BS, int64_t stride, float scale, float softcap, float eps, int32_t activation,
                int nthreads) {
    const int64_t QKV = (Hq + 2 * Hkv) * D;
    int64_t expert_floats = 0;
    for (int64_t l = 0; l < L; l++)
        if (layers[l].experts) {
            const int64_t n = experts_scratch_floats(layers[l].experts, M, H);
            expert_floats = n > expert_floats ? n : expert_floats;
        }
    const size_t floats = M * (H + QKV + 2 * Hq * D + H + 2 * I + I) + B * Hq * stride + expert_floats;
    float* scratch = malloc(floats * sizeof(float));
    if (!scratch) return -1;
    float *normed = scratch, *qkv = normed + M * H, *q = qkv + M * QKV, *att = q + M * Hq * D,
          *proj = att + M * Hq * D, *gu = proj + M * H, *act = gu + M * 2 * I, *scores = act + M * I,
          *expert_scratch = scores + B * Hq * stride;
    const gate_fn gate = activation == ACT_GELU_TANH ? gelu_tanh_mul : silu_mul;
    rmsnorm(hidden, layers[0].input_norm, normed, M, H, eps, nthreads);
    for (int64_t l = 0; l < L; l++) {
        const layer_t* ly = layers + l;
        quant_apply(ly->qkv, normed, H, qkv, QKV, M, ly->gemm_min[0], nthreads);
        adapters(ly->lora[0], normed, H, qkv, QKV, lora_rows, M, nthreads);
        const float *c = ly->rope == ROPE_LOCAL ? cos_local : cos, *sn = ly->rope == ROPE_LOCAL ? sin_local : sin;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M >= PAR_MIN_ROWS)
        for (int64_t m = 0; m < M; m++)
            qkv_row(ly, qkv + m * QKV, c + m * ly->rope_dim, sn + m * ly->rope_dim, q + m * Hq * D, slots[m], Hq,
                    Hkv, D, eps);
        if ((B && paged_decode(q, ly->k_cache, ly->v_cache, ly->k_scales, ly->v_scales, ly->kv_dtype, tables,
                               seq_lens, att, scores, B, Hq, Hkv, D, BS, W, stride, scale, softcap, nthreads)) ||
            (prompts->S && paged_prefill_kv(prompts->run, ly->kv_dtype, q, Hq * D, att, ly->k_cache, ly->v_cache,
                                            ly->k_scales, ly->v_scales, tables, W, prompts->trow, prompts->qstart,
                                            prompts->qlen, prompts->klen, prompts->S, Hq, Hkv, D, BS, scale,
                                            nthreads))) {
            free(scratch);
            return -1;
        }
        quant_apply(ly->o, att, Hq * D, proj, H, M, ly->gemm_min[1], nthreads);
        adapters(ly->lora[1], att, Hq * D, proj, H, lora_rows, M, nthreads);
        residual(hidden, proj, ly->attn_out_norm, ly->residual_scale, ly->post_norm, normed, M, H, eps, nthreads);
        if (ly->experts) {
            experts_mlp(ly->experts, normed, proj, M, H, gate, expert_scratch, nthreads);
        } else {
            const int64_t Il = ly->gate_up->N / 2; /* Qwen3-MoE's dense layers have their own size */
            quant_apply(ly->gate_up, normed, H, gu, 2 * Il, M, ly->gemm_min[2], nthreads);
            adapters(ly->lora[2], normed, H, gu, 2 * Il, lora_rows, M, nthreads);
            gate(gu, act, M, Il, nthreads);
            quant_apply(ly->down, act, Il, proj, H, M, ly->gemm_min[3], nthreads);
            adapters(ly->lora[3], act, Il, proj, H, lora_rows, M, nthreads);
        }
        /* the next layer's input norm, or after the last layer the final one */
        const int last = l == L - 1;
        residual(hidden, proj, ly->mlp_out_norm, ly->residual_scale, last ? final_norm : layers[l + 1].input_norm,
                 last ? out : normed, M, H, eps, nthreads);
    }
    free(scratch);
    return 0;
}
