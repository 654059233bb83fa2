"""A step's whole layer stack in one C call, for the native families' layers on the CPU (ModelConfig's
layer_stack_refusal names what it leaves to the torch layers).

At a few rows the decoder layer's work is small next to what it costs to reach it from Python: each layer
runs ~25 torch ops and 4 ctypes calls, and at one token that dispatch was ~60% of the step (py-spy on
SmolLM2-135M, Zen 3), with the second core idle meanwhile. Here the norms, rope, the K/V write, the
SiLU or GELU gate and the residual adds are small C loops, and the linears and attention are the same compiled
kernels the torch path calls (`quant_apply`, `paged_decode` and `paged_prefill_f32`), called directly: they
are in the same library (tgi_llm/csrc/layer_stack/layer_stack.c, tgi_llm.native). Same weights, same kernels,
same arithmetic order in the matmuls; the norms, rope and SiLU differ from torch's only in rounding.

Decode steps take it, and so do steps that mix decodes with prompt chunks (decodes first, as the scheduler
orders them) where the prefill attention kernel serves prompts: at 135 rows the torch layers' elementwise
ops and dispatch were ~11% of a mixed step (15 decodes + a 120-token chunk: 220 -> 195 ms, Zen 3). Only a
single-shard float32 CPU model whose linears all run on `quant_apply` (quantized ones, or float32 ones where
the C kernels serve them: models/layers/linear.py `float_linear_kernels`). The first fused step of each kind
(decode, mixed) is checked against the torch layers on the live model (the torch result is kept, and a
mismatch turns the fused path off with a warning). TGI_LLM_FUSED_DECODE=0 switches it off.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
from collections.abc import Callable

import torch

from tgi_llm.attention.cpu_kernels import (
    KV_DTYPES,
    MAX_PREFILL_GROUP,
    PrefillSequence,
    cpu_attention_kernels,
    prefill_arguments,
    scales_address,
)
from tgi_llm.attention.metadata import AttentionMetadata
from tgi_llm.attention.torch_paged import TorchPagedAttention
from tgi_llm.lora.weights import LoraBatch
from tgi_llm.models.config import TANH_GELU_NAMES
from tgi_llm.native import CheckedKernels
from tgi_llm.native.abi import Activation, Experts, Layer, Prompts, RopeTables, WeightKind
from tgi_llm.quant.kernels import quant_kernels
from tgi_llm.quant.linear import QuantLinear, gemm_min_tokens
from tgi_llm.settings import settings

logger = logging.getLogger(__name__)

#: Sequences of up to this many tokens at the front of a step run their rows through the decode kernel, one
#: position each, rather than through the prefill kernel, which pads a few query rows to whole vectors and
#: spreads one sequence over only as many work items as it has KV heads (tools/bench_verify_rows.py).
DECODE_ROWS_MAX = 5

#: The rope tables of one forward by name (models/decoder.py RopeTables): "global", and "local" where used.
RopeTableSet = dict[str, tuple[torch.Tensor, torch.Tensor]]

#: The layer stack of the kernels library, checked on the live model at its first step of each kind (FusedLayerStack);
#: TGI_LLM_FUSED_DECODE=0 is asked per model (_why_not).
layer_stack_library = CheckedKernels("fused decode", "TGI_LLM_FUSED_DECODE", lambda: True, lambda lib: lib,
                                     lambda _lib: "layer stack loaded")


def _on_kernels(linear) -> bool:
    """Whether `quant_apply` serves this linear: quantized, or a float one that took the C kernels."""
    return isinstance(linear, QuantLinear) or getattr(linear, "kernels", None) is not None


def _why_not(model, kv_caches) -> str | None:
    """Why this model can't run the fused stack (None: it can)."""
    if not settings().fused_decode:
        return "switched off by TGI_LLM_FUSED_DECODE=0"
    if (refusal := model.config.layer_stack_refusal) is not None:
        return f"it does not implement {refusal} ({model.config.family})"
    if model.device.type != "cpu" or model.dtype != torch.float32 or model.shard.world_size != 1:
        return "needs one float32 CPU shard"
    if not isinstance(model.attention_backend, TorchPagedAttention) or cpu_attention_kernels() is None:
        return "needs the CPU attention kernels"
    if quant_kernels() is None:
        return "needs the C linear kernels"
    for layer in model.layers:
        if not all(_on_kernels(m) for m in _linears(layer)):
            return "needs every linear on the C kernels (quantized, or float32 on a CPU where they serve it)"
    first = model.layers[0]
    dim, heads = first.head_dim, first.num_heads
    k = kv_caches[0][0]
    if dim % 16 or dim > 256 or heads > 256 or k.dtype not in KV_DTYPES:
        return f"head size {dim} / {heads} heads / KV {k.dtype} not supported by the attention kernel"
    if not all(c.is_contiguous() and c.shape == k.shape and c.dtype == k.dtype for pair in kv_caches for c in pair):
        return "needs contiguous K/V caches"
    return None


class FusedLayerStack:
    """The C layer stack for one model and one set of K/V caches. It holds raw pointers into both: its owner
    (the model) keeps them alive, and drops it with the caches (CausalLM.release_caches)."""

    def __init__(self, lib: ctypes.CDLL, model, kv_caches) -> None:
        self._lib = lib
        first = model.layers[0]
        self.heads, self.kv_heads, self.head_dim = first.num_heads, first.num_kv_heads, first.head_dim
        self.scale, self.eps = first.scale, model.config.rms_norm_eps
        self.hidden_size = model.config.hidden_size
        #: the largest dense MLP's intermediate size (experts size their own scratch)
        self.intermediate = max((layer.gate_up.desc().N // 2 for layer in model.layers if layer.moe is None),
                                default=0)
        self.final_norm = model.norm.weight.detach()
        self._experts = [_ExpertsArgs(layer.moe) if layer.moe is not None else None for layer in model.layers]
        rope_dims = {"global": model.rotary.dim, "local": getattr(model.local_rotary, "dim", 0), None: self.head_dim}
        self._layers = (Layer * len(model.layers))(*(
            _layer(layer, k, v, experts, rope_dims[layer.rope])
            for layer, (k, v), experts in zip(model.layers, kv_caches, self._experts, strict=True)))
        self.activation = (Activation.ACT_GELU_TANH if model.config.hidden_act in TANH_GELU_NAMES
                           else Activation.ACT_SILU)  # the two layer_stack_refusal lets through
        self._attention = cpu_attention_kernels()
        self._prefill_address = (self._attention.bf16_prefill_address if model.attention_backend.bf16_prefill
                                 else self._attention.prefill_address)
        self.block_size = kv_caches[0][0].shape[1]
        #: None until a first step was compared with the torch layers; then whether they agreed.
        self.agrees: bool | None = None
        #: How far the two may differ, relative to the largest output. The norms and rope here round
        #: differently from torch's ops (~1e-4); bfloat16 weights round each matmul's activations to 8 bits,
        #: a 16-bit cache each K and V, and such a difference that flips one of those roundings grows through
        #: the layers (0.8% measured on SmolLM2 in bfloat16): a wrong kernel differs by the size of the values.
        rounds = kv_caches[0][0].dtype != torch.float32 or any(
            m.desc().kind == WeightKind.QW_BF16_PANEL or m.desc().bf16_min_rows
            for layer in model.layers for m in _linears(layer))
        self.tolerance = 3e-2 if rounds else 1e-3
        self.checked: set[str] = set()  # the kinds of step compared so far: "decode", "mixed"
        #: Sequences longer than this have keys outside a sliding window, which this stack does not apply.
        self.window = model.config.narrowest_window
        #: Gemma 2's soft-capped scores: the decode kernel caps them, the prefill kernels do not.
        self.softcap = model.config.attn_logit_softcap

    @classmethod
    def build(cls, model, kv_caches) -> FusedLayerStack | None:
        reason = _why_not(model, kv_caches)
        lib = layer_stack_library() if reason is None else None
        if lib is None:
            logger.info("fused decode: off (%s)", reason or "no library")
            return None
        logger.info("fused decode: on (decode steps, and steps mixing decodes with prompt chunks, run the "
                    "layer stack in one C call)")
        return cls(lib, model, kv_caches)

    def takes(self, attn: AttentionMetadata, num_tokens: int) -> bool:
        """Whether this step can run here: decode rows first (decodes, and the short runs of tokens that
        verify draft tokens), then prompt chunks (the scheduler's order) where the prefill attention kernel
        serves the prompts (it measured faster than SDPA at load, and holds this many query heads per KV
        head); no sequence past a sliding window; with soft-capped scores, decode rows only."""
        if self.window is not None and attn.max_seq_len > self.window:
            return False
        if attn.is_pure_decode:
            return num_tokens == attn.num_seqs
        lens = attn.query_lens_cpu
        rest = lens[_leading_decode_rows(lens):]
        if not rest:
            return True
        if self.softcap is not None:
            return False
        if not (self._attention.prefill_wins and self.heads // self.kv_heads <= MAX_PREFILL_GROUP):
            return False
        return all(n > 1 for n in rest)

    def run(self, hidden: torch.Tensor, rope: RopeTableSet, attn: AttentionMetadata,
            reference: Callable[[], torch.Tensor], lora: LoraBatch | None = None) -> torch.Tensor:
        """Final-norm hidden states [M, H] of the step's M tokens (`hidden`: their embeddings, overwritten);
        `reference()` computes the same through the torch layers, used on the first step of each kind (with and
        without LoRA rows) to check."""
        lens = attn.query_lens_cpu
        kind = "decode" if attn.is_pure_decode else "verify" if _leading_decode_rows(lens) == len(lens) else "mixed"
        kind += " with LoRA" if lora is not None else ""
        if kind not in self.checked:
            return self._check(kind, hidden, rope, attn, reference, lora)
        return self._run(hidden, rope, attn, lora)

    def _run(self, hidden: torch.Tensor, rope: RopeTableSet, attn: AttentionMetadata, lora: LoraBatch | None = None
             ) -> torch.Tensor:
        hidden = hidden.contiguous()
        m = hidden.shape[0]
        out = torch.empty_like(hidden)
        cos, sin = (t.contiguous() for t in rope["global"])
        cos_local, sin_local = (t.contiguous() for t in rope.get("local", rope["global"]))
        slots = attn.slot_mapping.to(torch.int64).contiguous()
        lens_cpu = attn.query_lens_cpu
        # Each row of the leading short runs attends like a decode of its sequence at its own position.
        short = _leading_decode_rows(lens_cpu)
        row_seq = [i for i in range(short) for _ in range(lens_cpu[i])]
        row_lens = [attn.seq_lens_cpu[i] - lens_cpu[i] + 1 + r for i in range(short) for r in range(lens_cpu[i])]
        decodes = len(row_seq)
        block_tables = attn.block_tables.to(torch.int32)
        if decodes != short:
            index = torch.tensor(row_seq + list(range(short, len(lens_cpu))), dtype=torch.long)
            block_tables = block_tables.index_select(0, index)
        tables = block_tables.contiguous()
        lens = torch.tensor(row_lens, dtype=torch.int32)
        stride = -(-max(row_lens, default=0) // 16) * 16
        prompts = Prompts()  # S = 0: none
        if short < len(lens_cpu):
            first_rows = list(itertools.accumulate(lens_cpu, initial=0))[:-1]
            sequences = [PrefillSequence(start, n, seq_len, decodes + i - short) for i, (start, n, seq_len)
                         in enumerate(zip(first_rows, lens_cpu, attn.seq_lens_cpu, strict=True)) if i >= short]
            meta = prefill_arguments(sequences)
            prompts = Prompts(self._prefill_address, len(sequences), *(row.data_ptr() for row in meta))
        failed = self._lib.layer_stack(
            self._layers, len(self._layers), ctypes.byref(prompts), None if lora is None else lora.rows.data_ptr(),
            hidden.data_ptr(), out.data_ptr(), self.final_norm.data_ptr(), m, self.hidden_size, self.heads,
            self.kv_heads, self.head_dim, self.intermediate, cos.data_ptr(), sin.data_ptr(),
            cos_local.data_ptr(), sin_local.data_ptr(), slots.data_ptr(),
            tables.data_ptr(), tables.shape[1], decodes, lens.data_ptr(), self.block_size, stride, self.scale,
            self.softcap or 0.0, self.eps,
            self.activation, torch.get_num_threads())
        if failed:
            raise MemoryError("fused decode: no memory for its scratch buffers")
        return out

    def _check(self, kind: str, hidden, rope, attn, reference, lora) -> torch.Tensor:
        # The torch layers run second: the K/V they write (the same slots) are the ones kept.
        got = self._run(hidden.clone(), rope, attn, lora)
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


#: DecoderLayer.rope -> layer_t.rope
_ROPE_TABLES = {None: RopeTables.ROPE_NONE, "global": RopeTables.ROPE_GLOBAL, "local": RopeTables.ROPE_LOCAL}


def _weight(norm) -> int | None:
    return None if norm is None else norm.weight.data_ptr()


def _linears(layer) -> list:
    """Every linear of a decoder layer: its attention's, and its MLP's or each expert's."""
    mlp = [layer.gate_up, layer.down] if layer.moe is None else [*layer.moe.gate_up, *layer.moe.down]
    return [layer.qkv, layer.o_proj, *mlp]


class _ExpertsArgs:
    """An `experts_t` and the WeightDesc pointer arrays it points into, kept alive together."""

    def __init__(self, moe) -> None:
        gate_up, down = ([m.desc() for m in linears] for linears in (moe.gate_up, moe.down))
        self._descs = gate_up + down
        self._gate_up = (ctypes.c_void_p * len(gate_up))(*(ctypes.addressof(d) for d in gate_up))
        self._down = (ctypes.c_void_p * len(down))(*(ctypes.addressof(d) for d in down))
        self._router = moe.router.detach().float().contiguous()
        self.struct = Experts(router=self._router.data_ptr(), gate_up=ctypes.addressof(self._gate_up),
                              down=ctypes.addressof(self._down),
                              gemm_min=(ctypes.c_int64 * 2)(gemm_min_tokens(gate_up[0]), gemm_min_tokens(down[0])),
                              num_experts=len(gate_up), top_k=moe.top_k, normalize=int(moe.normalize))


def _layer(layer, k: torch.Tensor, v: torch.Tensor, experts: _ExpertsArgs | None, rope_dim: int) -> Layer:
    """qkv, o, gate_up, down: the last two NULL (gemm_min 0) where the layer has experts."""
    linears = [layer.qkv, layer.o_proj, *((layer.gate_up, layer.down) if experts is None else (None, None))]
    descs = [None if m is None else m.desc() for m in linears]
    adapters = layer.lora or {}
    lora = [adapters[name].address() if name in adapters else None for name in ("qkv", "o_proj", "gate_up", "down")]
    return Layer(
        *(None if d is None else ctypes.addressof(d) for d in descs),
        (ctypes.c_int64 * 4)(*(0 if d is None else gemm_min_tokens(d) for d in descs)),
        input_norm=_weight(layer.input_norm), post_norm=_weight(layer.mlp_norm),
        attn_out_norm=_weight(layer.attn_out_norm), mlp_out_norm=_weight(layer.mlp_out_norm),
        q_norm=_weight(layer.q_norm), k_norm=_weight(layer.k_norm), qk_norm_per_head=int(layer.qk_norm == "head"),
        rope=_ROPE_TABLES[layer.rope], residual_scale=layer.residual_multiplier, k_cache=k.data_ptr(),
        v_cache=v.data_ptr(), experts=None if experts is None else ctypes.addressof(experts.struct),
        rope_dim=rope_dim, kv_dtype=KV_DTYPES[k.dtype], k_scales=scales_address(k), v_scales=scales_address(v),
        lora=(ctypes.c_void_p * 4)(*lora))


def _leading_decode_rows(query_lens: list[int]) -> int:
    """How many sequences at the front of the step run as decode rows: decodes (one token each; the
    scheduler puts them first), then runs of up to DECODE_ROWS_MAX tokens (a decode with its draft tokens,
    a prompt's short last chunk), whose rows the decode kernel serves one position each."""
    n = 0
    while n < len(query_lens) and query_lens[n] <= DECODE_ROWS_MAX:
        n += 1
    return n
