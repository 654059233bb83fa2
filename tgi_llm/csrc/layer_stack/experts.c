/* A mixture of experts in the fused layer stack: each token's router logits, a softmax and its top_k experts;
   then each expert once over the rows routed to it (gathered, through quant_apply like a dense MLP), its
   outputs added back weighted. Experts in ascending order, as models/layers/moe.py adds them. Built with
   -ffp-contract=off like layer_stack.c. */
#include "experts.h"
#include "vectors.h"
#include <math.h>
#include <string.h>

static int64_t expert_inter(const experts_t* ex) { return ex->gate_up[0]->N / 2; }

int64_t experts_scratch_floats(const experts_t* ex, int64_t M, int64_t H) {
    const int64_t I = expert_inter(ex), E = ex->num_experts, K = ex->top_k;
    /* routed (token, slot) pairs and top-k experts (int32), router logits, top-k weights; then gathered
       rows, gate/up, act, expert output */
    return M + M * K + M * E + M * K + M * (H + 2 * I + I + H);
}

/* weights/chosen [K]: the top K of probs [E] (ties: the lower expert first), renormalized if asked */
static void route_row(const float* restrict logits, int64_t E, int64_t K, int normalize, float* restrict weights,
                      int32_t* restrict chosen) {
    float mx = logits[0], probs[E];
    for (int64_t e = 1; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    float sum = 0.f;
    for (int64_t e = 0; e < E; e++) sum += probs[e] = expf(logits[e] - mx);
    for (int64_t e = 0; e < E; e++) probs[e] /= sum;
    for (int64_t k = 0; k < K; k++) { /* selection: K is small */
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            int taken = 0;
            for (int64_t j = 0; j < k; j++) taken |= chosen[j] == e;
            if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
        }
        chosen[k] = (int32_t)best;
        weights[k] = probs[best];
    }
    if (normalize) {
        float total = 0.f;
        for (int64_t k = 0; k < K; k++) total += weights[k];
        for (int64_t k = 0; k < K; k++) weights[k] /= total;
    }
}

void experts_mlp(const experts_t* ex, const float* x, float* out, int64_t M, int64_t H, gate_fn gate,
                 float* scratch, int nthreads) {
    const int64_t E = ex->num_experts, K = ex->top_k, I = expert_inter(ex);
    int32_t *rows = (int32_t*)scratch, *chosen = rows + M; /* rows: the (token, slot)s of the expert at hand */
    float *logits = (float*)(chosen + M * K), *weights = logits + M * E;
    /* the router: [E, H] float32, a dot product per (token, expert) */
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M * E * H >= (1 << 20))
    for (int64_t m = 0; m < M; m++) {
        for (int64_t e = 0; e < E; e++) {
            const float *a = x + m * H, *r = ex->router + e * H;
            V acc = vzero();
            int64_t h = 0;
            for (; h + VL <= H; h += VL) acc = vfma(vld(a + h), vld(r + h), acc);
            float dot = vsum(acc);
            for (; h < H; h++) dot += a[h] * r[h];
            logits[m * E + e] = dot;
        }
        route_row(logits + m * E, E, K, ex->normalize, weights + m * K, chosen + m * K);
    }
    float *xs = weights + M * K, *gu = xs + M * H, *act = gu + M * 2 * I, *ys = act + M * I;
    memset(out, 0, M * H * sizeof(float));
    for (int64_t e = 0; e < E; e++) {
        int64_t n = 0;
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++)
                if (chosen[m * K + k] == e) {
                    memcpy(xs + n * H, x + m * H, H * sizeof(float));
                    rows[n++] = (int32_t)(m * K + k);
                }
        if (!n) continue;
        quant_apply(ex->gate_up[e], xs, H, gu, 2 * I, n, ex->gemm_min[0], nthreads);
        gate(gu, act, n, I, nthreads);
        quant_apply(ex->down[e], act, I, ys, H, n, ex->gemm_min[1], nthreads);
        for (int64_t i = 0; i < n; i++) {
            float* o = out + rows[i] / K * H;
            const float w = weights[rows[i]];
            for (int64_t h = 0; h < H; h++) o[h] += ys[i * H + h] * w;
        }
    }
}
