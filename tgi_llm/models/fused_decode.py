"""A step's whole layer stack in one C call, for Llama-family models on the CPU.

At a few rows the decoder layer's work is small next to what it costs to reach it from Python: each layer
runs ~25 torch ops and 4 ctypes calls, and at one token that dispatch was ~60% of the step (py-spy on
SmolLM2-135M, Zen 3), with the second core idle meanwhile. Here the norms, rope, the K/V write, the
SiLU gate and the residual adds are small C loops, and the linears and attention are the same compiled
kernels the torch path calls (`quant_apply` of quant/kernels.py, `paged_decode_f32` and `paged_prefill_f32`
of attention/cpu_kernels.py), reached through their addresses. Same weights, same kernels, same arithmetic
order in the matmuls; the norms, rope and SiLU differ from torch's only in rounding.

Decode steps take it, and so do steps that mix decodes with prompt chunks (decodes first, as the scheduler
orders them) where the prefill attention kernel serves prompts: at 135 rows the torch layers' elementwise
ops and dispatch were ~11% of a mixed step (15 decodes + a 120-token chunk: 220 -> 195 ms, Zen 3). Only a
single-shard float32 CPU model whose linears all run on `quant_apply` (quantized ones, or float32 ones where
the C kernels serve them: models/llama.py `float_linear_kernels`). The first fused step of each kind
(decode, mixed) is checked against the torch layers on the live model (the torch result is kept, and a
mismatch turns the fused path off with a warning). TGI_LLM_FUSED_DECODE=0 switches it off.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from tgi_llm.attention.cpu_kernels import MAX_PREFILL_GROUP, PrefillSequence, cpu_attention_kernels, prefill_arguments
from tgi_llm.attention.metadata import AttentionMetadata
from tgi_llm.attention.torch_paged import TorchPagedAttention
from tgi_llm.native_build import BASE_FLAGS, build_library
from tgi_llm.native_vectors import VECTORS_C
from tgi_llm.quant.kernels import QW_BF16_PANEL, quant_kernels
from tgi_llm.quant.linear import QuantLinear, gemm_min_tokens
from tgi_llm.settings import settings

logger = logging.getLogger(__name__)

_SOURCE = VECTORS_C + r"""
#include <math.h>
#include <stdlib.h>

typedef struct {
    const void *qkv, *o, *gate_up, *down; /* qweight_t of quant/kernels.py */
    int64_t gemm_min[4]; /* rows from which each of them takes the GEMM (quant/linear.py gemm_min_tokens) */
    const float *input_norm, *post_norm;
    float *k_cache, *v_cache; /* [blocks, BS, Hkv, D] */
} layer_t;

typedef void (*apply_fn)(const void* w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M,
                         int64_t gemm_min, int nthreads);
typedef void (*attention_fn)(const float* q, const float* kc, const float* vc, const int32_t* tables,
                             const int32_t* seq_lens, float* out, float* scores, int64_t B, int64_t Hq,
                             int64_t Hkv, int64_t D, int64_t BS, int64_t W, int64_t stride, float scale,
                             int nthreads);
/* paged_prefill_f32 of attention/cpu_kernels.py */
typedef int (*prefill_fn)(const float* q, int64_t qs, float* out, const float* kc, const float* vc,
                          const int32_t* tables, int64_t W, const int64_t* trow, const int64_t* qstart,
                          const int64_t* qlen, const int64_t* klen, int64_t S, int64_t Hq, int64_t Hkv,
                          int64_t D, int64_t BS, float scale, int nthreads);

/* The prompt chunks of a step, as paged_prefill_f32 takes them (S = 0: a decode step) */
typedef struct {
    prefill_fn run;
    int64_t S;
    const int64_t *trow, *qstart, *qlen, *klen;
} prompts_t;

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
int layer_stack(const layer_t* layers, int64_t L, apply_fn apply, attention_fn attention, const prompts_t* prompts,
                float* hidden, float* out, const float* final_norm, int64_t M, int64_t H, int64_t Hq, int64_t Hkv,
                int64_t D, int64_t I, const float* cos, const float* sin, const int64_t* slots,
                const int32_t* tables, int64_t W, int64_t B, const int32_t* seq_lens, int64_t BS, int64_t stride,
                float scale, float eps, int nthreads) {
    const int64_t QKV = (Hq + 2 * Hkv) * D, tok = Hkv * D;
    const size_t floats = M * (H + QKV + 2 * Hq * D + H + 2 * I + I) + B * Hq * stride;
    float* scratch = malloc(floats * sizeof(float));
    if (!scratch) return -1;
    float *normed = scratch, *qkv = normed + M * H, *q = qkv + M * QKV, *att = q + M * Hq * D,
          *proj = att + M * Hq * D, *gu = proj + M * H, *act = gu + M * 2 * I, *scores = act + M * I;
    rmsnorm(hidden, layers[0].input_norm, normed, M, H, eps, nthreads);
    for (int64_t l = 0; l < L; l++) {
        const layer_t* ly = layers + l;
        apply(ly->qkv, normed, H, qkv, QKV, M, ly->gemm_min[0], nthreads);
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M >= PAR_MIN_ROWS)
        for (int64_t m = 0; m < M; m++) {
            const float *row = qkv + m * QKV, *c = cos + m * D, *s = sin + m * D;
            float* kdst = ly->k_cache + slots[m] * tok;
            for (int64_t h = 0; h < Hq; h++) rope_row(row + h * D, c, s, q + (m * Hq + h) * D, D);
            for (int64_t h = 0; h < Hkv; h++) rope_row(row + (Hq + h) * D, c, s, kdst + h * D, D);
            memcpy(ly->v_cache + slots[m] * tok, row + (Hq + Hkv) * D, tok * sizeof(float));
        }
        if (B)
            attention(q, ly->k_cache, ly->v_cache, tables, seq_lens, att, scores, B, Hq, Hkv, D, BS, W, stride, scale,
                      nthreads);
        if (prompts->S && prompts->run(q, Hq * D, att, ly->k_cache, ly->v_cache, tables, W, prompts->trow,
                                       prompts->qstart, prompts->qlen, prompts->klen, prompts->S, Hq, Hkv, D, BS,
                                       scale, nthreads)) {
            free(scratch);
            return -1;
        }
        apply(ly->o, att, Hq * D, proj, H, M, ly->gemm_min[1], nthreads);
        add_rmsnorm(hidden, proj, ly->post_norm, normed, M, H, eps, nthreads);
        apply(ly->gate_up, normed, H, gu, 2 * I, M, ly->gemm_min[2], nthreads);
        silu_mul(gu, act, M, I, nthreads);
        apply(ly->down, act, I, proj, H, M, ly->gemm_min[3], nthreads);
        /* the next layer's input norm, or after the last layer the final one */
        const int last = l == L - 1;
        add_rmsnorm(hidden, proj, last ? final_norm : layers[l + 1].input_norm, last ? out : normed, M, H, eps,
                    nthreads);
    }
    free(scratch);
    return 0;
}
"""

#: No contraction of a*b + c*d into an FMA: rope and the norms round like torch's separate ops.
_FLAGS = (*BASE_FLAGS, "-ffp-contract=off")


class _Prompts(ctypes.Structure):
    _fields_ = [("run", ctypes.c_void_p), ("S", ctypes.c_int64), ("trow", ctypes.c_void_p),
                ("qstart", ctypes.c_void_p), ("qlen", ctypes.c_void_p), ("klen", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", ctypes.c_void_p), ("o", ctypes.c_void_p), ("gate_up", ctypes.c_void_p),
                ("down", ctypes.c_void_p), ("gemm_min", ctypes.c_int64 * 4), ("input_norm", ctypes.c_void_p),
                ("post_norm", ctypes.c_void_p),
                ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def load_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.layer_stack.argtypes = ([p, i64, p, p, p, p, p, p] + [i64] * 6 + [p] * 4 + [i64, i64, p] + [i64] * 2
                                + [ctypes.c_float] * 2 + [ctypes.c_int])
    lib.layer_stack.restype = ctypes.c_int
    return lib


def library_path() -> Path:
    """This CPU's build of the stack (compiled once per machine, native_build.py)."""
    return build_library("fused_decode", _SOURCE, flags=_FLAGS)


def library() -> ctypes.CDLL | None:
    """The compiled stack (built once per machine and cached, like the kernels), or None if it can't be."""
    global _lib, _tried
    if _tried:
        return _lib
    with _lock:
        if not _tried:
            try:
                _lib = load_library(library_path())
            except Exception as exc:  # an optional fast path: the torch layers serve without it
                logger.warning("fused decode: unavailable, decode steps run the torch layers: %s", exc)
            _tried = True
    return _lib


def _on_kernels(linear) -> bool:
    """Whether `quant_apply` serves this linear: quantized, or a float one that took the C kernels."""
    return isinstance(linear, QuantLinear) or getattr(linear, "kernels", None) is not None


def _why_not(model, kv_caches) -> str | None:
    """Why this model can't run the fused stack (None: it can)."""
    if not settings().fused_decode:
        return "switched off by TGI_LLM_FUSED_DECODE=0"
    if model.device.type != "cpu" or model.dtype != torch.float32 or model.shard.world_size != 1:
        return "needs one float32 CPU shard"
    if not isinstance(model.attention_backend, TorchPagedAttention) or cpu_attention_kernels() is None:
        return "needs the CPU attention kernels"
    if quant_kernels() is None:
        return "needs the C linear kernels"
    for layer in model.layers:
        if not all(_on_kernels(m) for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)):
            return "needs every linear on the C kernels (quantized, or float32 on a CPU where they serve it)"
    first = model.layers[0]
    dim, heads = first.head_dim, first.num_heads
    k = kv_caches[0][0]
    if dim % 16 or dim > 256 or heads > 256 or k.dtype != torch.float32:
        return f"head size {dim} / {heads} heads / KV {k.dtype} not supported by the attention kernel"
    if not all(c.is_contiguous() and c.shape == k.shape for pair in kv_caches for c in pair):
        return "needs contiguous K/V caches"
    return None


class FusedDecode:
    """The C layer stack for one model and one set of K/V caches. It holds raw pointers into both: its owner
    (the model) keeps them alive, and drops it with the caches (LlamaForCausalLM.release_caches)."""

    def __init__(self, lib: ctypes.CDLL, model, kv_caches) -> None:
        self._lib = lib
        first = model.layers[0]
        self.heads, self.kv_heads, self.head_dim = first.num_heads, first.num_kv_heads, first.head_dim
        self.scale, self.eps = first.scale, first.input_norm.eps
        self.hidden_size = model.config.hidden_size
        self.intermediate = first.gate_up.desc().N // 2
        self.final_norm = model.norm.weight.detach()
        self._layers = (_Layer * len(model.layers))(*(
            _Layer(*(ctypes.addressof(d) for d in descs), (ctypes.c_int64 * 4)(*(gemm_min_tokens(d) for d in descs)),
                   layer.input_norm.weight.data_ptr(), layer.post_attention_norm.weight.data_ptr(),
                   k.data_ptr(), v.data_ptr())
            for layer, (k, v) in zip(model.layers, kv_caches, strict=True)
            for descs in [[m.desc() for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]]))
        self._apply = quant_kernels().apply_address
        self._attention = cpu_attention_kernels()
        self._prefill_address = (self._attention.bf16_prefill_address if model.attention_backend.bf16_prefill
                                 else self._attention.prefill_address)
        self.block_size = kv_caches[0][0].shape[1]
        #: None until a first step was compared with the torch layers; then whether they agreed.
        self.agrees: bool | None = None
        #: How far the two may differ, relative to the largest output. The norms and rope here round
        #: differently from torch's ops (~1e-4); bfloat16 weights round each matmul's activations to 8 bits,
        #: and such a difference that flips one of those roundings grows through the layers (0.8% measured
        #: on SmolLM2 in bfloat16): a wrong kernel differs by the size of the values themselves.
        self.tolerance = 3e-2 if any(m.desc().kind == QW_BF16_PANEL or m.desc().bf16_min_rows
                                     for layer in model.layers
                                     for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)) else 1e-3
        self.checked: set[str] = set()  # the kinds of step compared so far: "decode", "mixed"

    @classmethod
    def build(cls, model, kv_caches) -> FusedDecode | None:
        reason = _why_not(model, kv_caches)
        lib = library() if reason is None else None
        if lib is None:
            logger.info("fused decode: off (%s)", reason or "no library")
            return None
        logger.info("fused decode: on (decode steps, and steps mixing decodes with prompt chunks, run the "
                    "layer stack in one C call)")
        return cls(lib, model, kv_caches)

    def takes(self, attn: AttentionMetadata, num_tokens: int) -> bool:
        """Whether this step can run here: decodes only, or decodes first and then prompt chunks (the
        scheduler's order) where the prefill attention kernel serves the prompts (it measured faster than
        SDPA at load, and holds this many query heads per KV head)."""
        if attn.is_pure_decode:
            return num_tokens == attn.num_seqs
        if not (self._attention.prefill_wins and self.heads // self.kv_heads <= MAX_PREFILL_GROUP):
            return False
        lens = attn.query_lens_cpu
        decodes = _leading_decodes(lens)
        return all(n > 1 for n in lens[decodes:])

    def run(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionMetadata,
            reference: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Final-norm hidden states [M, H] of the step's M tokens (`hidden`: their embeddings, overwritten);
        `reference()` computes the same through the torch layers, used on the first step of each kind to check."""
        kind = "decode" if attn.is_pure_decode else "mixed"
        if kind not in self.checked:
            return self._check(kind, hidden, cos, sin, attn, reference)
        return self._run(hidden, cos, sin, attn)

    def _run(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionMetadata
             ) -> torch.Tensor:
        hidden = hidden.contiguous()
        m = hidden.shape[0]
        out = torch.empty_like(hidden)
        cos, sin = cos.contiguous(), sin.contiguous()
        tables = attn.block_tables.to(torch.int32).contiguous()
        slots = attn.slot_mapping.to(torch.int64).contiguous()
        lens_cpu = attn.query_lens_cpu
        decodes = _leading_decodes(lens_cpu)
        lens = attn.seq_lens[:decodes].to(torch.int32).contiguous()
        stride = -(-max(attn.seq_lens_cpu[:decodes], default=0) // 16) * 16
        prompts = _Prompts()  # S = 0: none
        if decodes < len(lens_cpu):
            first_rows = list(itertools.accumulate(lens_cpu, initial=0))[:-1]
            sequences = [PrefillSequence(start, n, seq_len, i) for i, (start, n, seq_len)
                         in enumerate(zip(first_rows, lens_cpu, attn.seq_lens_cpu, strict=True)) if i >= decodes]
            meta = prefill_arguments(sequences)
            prompts = _Prompts(self._prefill_address, len(sequences), *(row.data_ptr() for row in meta))
        failed = self._lib.layer_stack(
            self._layers, len(self._layers), self._apply, self._attention.decode_address, ctypes.byref(prompts),
            hidden.data_ptr(), out.data_ptr(), self.final_norm.data_ptr(), m, self.hidden_size, self.heads,
            self.kv_heads, self.head_dim, self.intermediate, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
            tables.data_ptr(), tables.shape[1], decodes, lens.data_ptr(), self.block_size, stride, self.scale, self.eps,
            torch.get_num_threads())
        if failed:
            raise MemoryError("fused decode: no memory for its scratch buffers")
        return out

    def _check(self, kind: str, hidden, cos, sin, attn, reference) -> torch.Tensor:
        # The torch layers run second: the K/V they write (the same slots) are the ones kept.
        got = self._run(hidden.clone(), cos, sin, attn)
        want = reference()
        scale = max(1.0, want.abs().max().item())
        self.agrees = bool(torch.allclose(got, want, rtol=self.tolerance, atol=self.tolerance * scale))
        self.checked.add(kind)
        difference = (got - want).abs().max().item()
        if self.agrees:
            logger.info("fused decode: agrees with the torch layers on a %s step (max difference %.2e)", kind,
                        difference)
        else:
            logger.warning("fused decode: off, it disagrees with the torch layers on a %s step (max difference "
                           "%.2e)", kind, difference)
        return want


def _leading_decodes(query_lens: list[int]) -> int:
    """How many sequences at the front of the step feed one token each (the scheduler puts decodes first)."""
    n = 0
    while n < len(query_lens) and query_lens[n] == 1:
        n += 1
    return n
