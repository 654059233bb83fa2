/* The layout of every struct and the value of every enum that crosses the ctypes boundary, as this build
   compiled them: tgi_llm/native/abi.py compares them with its ctypes mirrors at load, so that a field added
   on one side only fails loudly instead of shifting every pointer after it. */
#include "kernels.h"
#include <stddef.h>

typedef struct {
    const char* name;
    int64_t value;
} abi_entry_t;

#define SIZE(type) {"sizeof(" #type ")", sizeof(type)}
#define FIELD(type, field) {#type "." #field, offsetof(type, field)}
#define VALUE(constant) {#constant, constant}

static const abi_entry_t entries[] = {
    SIZE(qweight_t),
    FIELD(qweight_t, kind),
    FIELD(qweight_t, f16),
    FIELD(qweight_t, group),
    FIELD(qweight_t, N),
    FIELD(qweight_t, K),
    FIELD(qweight_t, codes),
    FIELD(qweight_t, scales),
    FIELD(qweight_t, mins),
    FIELD(qweight_t, bias),
    FIELD(qweight_t, bf16_min_rows),
    SIZE(layer_t),
    FIELD(layer_t, qkv),
    FIELD(layer_t, o),
    FIELD(layer_t, gate_up),
    FIELD(layer_t, down),
    FIELD(layer_t, gemm_min),
    FIELD(layer_t, input_norm),
    FIELD(layer_t, post_norm),
    FIELD(layer_t, attn_out_norm),
    FIELD(layer_t, mlp_out_norm),
    FIELD(layer_t, q_norm),
    FIELD(layer_t, k_norm),
    FIELD(layer_t, qk_norm_per_head),
    FIELD(layer_t, rope),
    FIELD(layer_t, residual_scale),
    FIELD(layer_t, k_cache),
    FIELD(layer_t, v_cache),
    FIELD(layer_t, experts),
    FIELD(layer_t, rope_dim),
    FIELD(layer_t, kv_dtype),
    FIELD(layer_t, k_scales),
    FIELD(layer_t, v_scales),
    FIELD(layer_t, lora),
    SIZE(lora_t),
    FIELD(lora_t, parts),
    FIELD(lora_t, rank),
    FIELD(lora_t, K),
    FIELD(lora_t, N),
    FIELD(lora_t, offsets),
    FIELD(lora_t, ranks),
    FIELD(lora_t, a),
    FIELD(lora_t, bt),
    SIZE(experts_t),
    FIELD(experts_t, router),
    FIELD(experts_t, gate_up),
    FIELD(experts_t, down),
    FIELD(experts_t, gemm_min),
    FIELD(experts_t, num_experts),
    FIELD(experts_t, top_k),
    FIELD(experts_t, normalize),
    SIZE(prompts_t),
    FIELD(prompts_t, run),
    FIELD(prompts_t, S),
    FIELD(prompts_t, trow),
    FIELD(prompts_t, qstart),
    FIELD(prompts_t, qlen),
    FIELD(prompts_t, klen),
    VALUE(QW_Q4_GGUF),
    VALUE(QW_Q4_X8),
    VALUE(QW_Q8),
    VALUE(QW_Q4_PANEL),
    VALUE(QW_F32),
    VALUE(QW_Q8_PANEL),
    VALUE(QW_F32_PANEL),
    VALUE(QW_BF16_PANEL),
    VALUE(ACT_SILU),
    VALUE(ACT_GELU_TANH),
    VALUE(ROPE_NONE),
    VALUE(ROPE_GLOBAL),
    VALUE(ROPE_LOCAL),
    VALUE(KV_F32),
    VALUE(KV_BF16),
    VALUE(KV_F16),
    VALUE(KV_Q8),
    VALUE(KV_Q8_GROUP),
    {NULL, 0},
};

const abi_entry_t* native_abi(void) { return entries; }
