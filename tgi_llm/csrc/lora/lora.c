/* LoRA adapters beside a base linear: y[m] += B_s A_s x[m] for every row m of a step whose sequence runs
   adapter s, after the base linear ran once for all rows. Punica's BGMV, one row at a time: a row reads its
   adapter's A (shrink, r dot products over K) and B (expand, r scaled row adds over the part's outputs). The
   rows of one prompt chunk share an adapter, whose A and B for one layer (a few hundred KB at rank 16) stay in
   the cache from row to row. A fused linear (q/k/v, gate/up) has one adapter part per projection, each with
   its own rank (0: the adapter leaves it alone). The scaling (alpha / r, or alpha / sqrt(r)) is in B. */
#include "kernels.h"
#include "vectors.h"

static float dot(const float* restrict a, const float* restrict b, int64_t K) {
    V acc = vzero();
    int64_t k = 0;
    for (; k + VL <= K; k += VL) acc = vfma(vld(a + k), vld(b + k), acc);
    float s = vsum(acc);
    for (; k < K; k++) s += a[k] * b[k];
    return s;
}

/* y[:n] += t * x[:n] */
static void add_scaled(float* restrict y, const float* restrict x, float t, int64_t n) {
    const V tv = vset1(t);
    int64_t i = 0;
    for (; i + VL <= n; i += VL) vst(y + i, vfma(tv, vld(x + i), vld(y + i)));
    for (; i < n; i++) y[i] += t * x[i];
}

void lora_apply(const lora_t* w, const float* x, int64_t ldx, float* y, int64_t ldy, const int32_t* row_slots,
                int64_t M, int nthreads) {
    const int64_t P = w->parts, R = w->rank, K = w->K, N = w->N;
#pragma omp parallel for collapse(2) num_threads(nthreads) schedule(dynamic) if (M * P > 1)
    for (int64_t m = 0; m < M; m++) {
        for (int64_t p = 0; p < P; p++) {
            const int64_t s = row_slots[m];
            const int64_t r = s < 0 ? 0 : w->ranks[s * P + p];
            if (r == 0) continue;
            const int64_t first = w->offsets[p], n = w->offsets[p + 1] - first;
            const float* a = w->a + (s * P + p) * R * K;
            const float* bt = w->bt + s * R * N + R * first; /* [r, n]: B transposed */
            float t[R];
            for (int64_t j = 0; j < r; j++) t[j] = dot(x + m * ldx, a + j * K, K);
            float* ym = y + m * ldy + first;
            for (int64_t j = 0; j < r; j++) add_scaled(ym, bt + j * n, t[j], n);
        }
    }
}
