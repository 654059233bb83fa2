/* What the kernels share with each other and with Python: the one definition of each struct and enum that
   crosses the ctypes boundary (mirrored in tgi_llm/native/abi.py, checked against it at load through
   native_abi in abi.c) and the exported entry points. */
#ifndef TGI_KERNELS_H
#define TGI_KERNELS_H

#include <stdint.h>

/* qweight_t.kind: the weight's layout and byte order */
typedef enum {
    QW_Q4_GGUF,
    QW_Q4_X8,
    QW_Q8,
    QW_Q4_PANEL,
    QW_F32,
    QW_Q8_PANEL,
    QW_F32_PANEL,
    QW_BF16_PANEL,
} qweight_kind_t;

/* Any weight, for quant_apply: the decode kernel below gemm_min rows, the GEMM from there, then the bias */
typedef struct {
    int32_t kind; /* qweight_kind_t */
    int32_t f16; /* scales and mins are float16 (else float32) */
    int64_t group, N, K;
    const void *codes, *scales, *mins; /* mins: q4, and q8 when asymmetric (else NULL) */
    /* QW_F32: codes is the float32 weight [N, K]; no scales or mins */
    const float* bias; /* [N] or NULL */
    int64_t bf16_min_rows; /* q4/q8 panels: rows from which the GEMM takes bfloat16 products (0: never) */
} qweight_t;

/* layer_stack's MLP activation: act(gate) * up */
typedef enum {
    ACT_SILU,
    ACT_GELU_TANH,
} activation_t;

/* layer_t.rope: which rotary tables a layer's q and k take */
typedef enum {
    ROPE_NONE,   /* SmolLM3's layers without position encoding */
    ROPE_GLOBAL, /* cos/sin */
    ROPE_LOCAL,  /* cos_local/sin_local: Gemma 3's sliding layers */
} rope_tables_t;

/* The element type of the paged K/V caches (--kv-cache-dtype): attention converts each element to float32
   as it reads it, and accumulates in float32. KV_Q8 (int8): int8 codes, and beside the cache a float16
   scale for each run of KV_Q8_GROUP elements (element i's at scales[i / KV_Q8_GROUP]: a head's row is whole
   groups): llama.cpp's q8_0 scheme, in groups of 16 */
typedef enum {
    KV_F32,
    KV_BF16,
    KV_F16,
    KV_Q8,
} kv_dtype_t;

#define KV_Q8_GROUP 16 /* kv_cache.py Q8_GROUP */

/* bytes of one cache element (KV_Q8: its code; the scales lie apart) */
static inline __attribute__((always_inline)) int64_t kv_bytes(const int kind) {
    return kind == KV_F32 ? 4 : kind == KV_Q8 ? 1 : 2;
}

/* A layer's mixture of experts (Mixtral, Qwen3-MoE): softmax over the router's logits, each token's top_k
   experts (their probabilities renormalized to sum to 1 where `normalize`), sum of weight x expert MLP */
typedef struct {
    const float* router;             /* [E, H] float32 */
    const qweight_t* const* gate_up; /* E weights [2 I_e, H]: gate rows, then up rows */
    const qweight_t* const* down;    /* E weights [H, I_e] */
    int64_t gemm_min[2];             /* as layer_t's, for every expert's gate_up and down */
    int32_t num_experts, top_k, normalize;
} experts_t;

/* One linear's LoRA adapters, in every slot (lora/weights.py LinearLora): output part p (q, k, v of a fused
   qkv) spans columns [offsets[p], offsets[p + 1]); slot s's part p has rank ranks[s * parts + p] (0: none),
   its A at a[(s * parts + p) * rank * K] ([rank, K], rows past its rank unused) and its B transposed, scaled,
   at bt[s * rank * N + rank * offsets[p]] ([rank, width of p]) */
typedef struct {
    int64_t parts, rank, K, N;
    const int64_t* offsets;
    const int32_t* ranks;
    const float *a, *bt;
} lora_t;

/* One decoder layer of the fused stack */
typedef struct {
    const qweight_t *qkv, *o, *gate_up, *down; /* gate_up, down: NULL where `experts` is not */
    int64_t gemm_min[4]; /* rows from which each of them takes the GEMM (quant/linear.py gemm_min_tokens) */
    const float *input_norm, *post_norm;       /* before attention, before the MLP (NULL: none, as OLMo 2) */
    const float *attn_out_norm, *mlp_out_norm; /* on each block's output before its residual add (NULL: none) */
    const float *q_norm, *k_norm;              /* before rope (NULL: none): [D] per head, else over q's and k's
                                                  whole projection ([Hq*D], [Hkv*D]) */
    int32_t qk_norm_per_head;
    int32_t rope;         /* rope_tables_t */
    float residual_scale; /* each block's output times this before the residual add (Granite; else 1) */
    void *k_cache, *v_cache;  /* [blocks, BS, Hkv, D] of kv_dtype */
    const experts_t* experts; /* NULL: a dense MLP */
    int64_t rope_dim;         /* the first rope_dim of each head are rotated (its tables' width), the rest pass */
    int32_t kv_dtype;         /* kv_dtype_t */
    void *k_scales, *v_scales; /* KV_Q8: the caches' scales (else NULL) */
    const lora_t* lora[4];     /* each of qkv, o, gate_up, down's adapters (NULL: none) */
} layer_t;

/* paged_prefill_f32 and its bfloat16 variants */
typedef int (*prefill_fn)(const float* q, int64_t qs, float* out, const float* kc, const float* vc,
                          const int32_t* tables, int64_t W, const int64_t* trow, const int64_t* qstart,
                          const int64_t* qlen, const int64_t* klen, int64_t S, int64_t Hq, int64_t Hkv,
                          int64_t D, int64_t BS, float scale, int nthreads);

/* The prompt chunks of a step, as the prefill kernels take them (S = 0: a decode step); `run` is the
   prefill kernel chosen at load (float32 or bfloat16 products) */
typedef struct {
    prefill_fn run;
    int64_t S;
    const int64_t *trow, *qstart, *qlen, *klen;
} prompts_t;

/* quant/linear.c */
int panel_lanes(void);
int q8_panel_lanes(void);
int panel_rows_per_pass(void);
int amx_usable(void);
void set_amx_min_rows(int64_t rows, int64_t bf16_rows, int64_t q4_rows);
void quant_apply(const qweight_t* w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                 int64_t gemm_min, int nthreads);

/* attention/paged.c */
int paged_decode(const float* q, const void* kc, const void* vc, const void* ks, const void* vs, int32_t kv_dtype,
                 const int32_t* block_tables, const int32_t* seq_lens, float* out, float* scores, int64_t B,
                 int64_t Hq, int64_t Hkv, int64_t D, int64_t BS, int64_t W, int64_t stride, float scale,
                 float softcap, int nthreads);
int paged_prefill_kv(prefill_fn run, int32_t kv_dtype, const float* q, int64_t qs, float* out, const void* kc,
                     const void* vc, const void* ks, const void* vs, const int32_t* tables, int64_t W,
                     const int64_t* trow, const int64_t* qstart, const int64_t* qlen, const int64_t* klen, int64_t S,
                     int64_t Hq, int64_t Hkv, int64_t D, int64_t BS, float scale, int nthreads);
void kv_store_row(void* dst, void* scales, const float* src, int64_t n, int32_t kv_dtype);
int paged_prefill_f32(const float* q, int64_t qs, float* out, const float* kc, const float* vc,
                      const int32_t* tables, int64_t W, const int64_t* trow, const int64_t* qstart,
                      const int64_t* qlen, const int64_t* klen, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                      int64_t BS, float scale, int nthreads);
int has_bf16_prefill(void);
int has_amx_prefill(void);
void set_amx_prefill(int on);

/* lora/lora.c */
void lora_apply(const lora_t* w, const float* x, int64_t ldx, float* y, int64_t ldy, const int32_t* row_slots,
                int64_t M, int nthreads);

/* layer_stack/layer_stack.c */
int layer_stack(const layer_t* layers, int64_t L, const prompts_t* prompts, const int32_t* lora_rows, float* hidden, float* out,
                const float* final_norm, int64_t M, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I,
                const float* cos, const float* sin, const float* cos_local, const float* sin_local,
                const int64_t* slots, const int32_t* tables, int64_t W, int64_t B, const int32_t* seq_lens,
                int64_t BS, int64_t stride, float scale, float softcap, float eps, int32_t activation,
                int nthreads);

#endif /* TGI_KERNELS_H */
