"""Llama-family causal LM (Llama, Mistral, Qwen2) over a flat, unpadded, paged batch.

q/k/v and gate/up are fused into one matmul each at load time. Every linear weight is read
through `WeightLoader` (weight_loader.py: float, or quantized per `--quantize`), which takes a `Shard`:
column-parallel (q/k/v, gate/up) splits output rows, row-parallel (o, down) splits input columns,
vocab-parallel splits embedding/lm_head rows. Each rank's slice is all it reads; `tp_ops` adds the
collectives (all-reduce after the row-parallel ones and the vocab-parallel embedding, gather of the LM
head's logits), which are plain local ops with one shard.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tgi_llm.attention import AttentionBackend, prepare_cpu_attention, select_attention_backend
from tgi_llm.attention.metadata import AttentionMetadata
from tgi_llm.hugepages import huge_page_bytes, in_huge_pages, weights_in_huge_pages
from tgi_llm.models.config import ModelConfig
from tgi_llm.models.layer_stack import FusedLayerStack, layer_stack_library
from tgi_llm.models.rope import RotaryEmbedding, apply_rotary_tables, rotary_tables
from tgi_llm.models.weight_loader import WeightLoader
from tgi_llm.native.abi import WeightDesc
from tgi_llm.parallel import tp_ops
from tgi_llm.quant.formats import (
    QuantizedWeight,
    bf16_panel_rows,
    from_bf16_panels,
    from_panels,
    panel_rows,
    to_bf16_panels,
    to_panels,
)
from tgi_llm.quant.kernels import LinearKernels, dense_desc, quant_kernels
from tgi_llm.quant.linear import BF16_GEMM_MIN_TOKENS, QuantLinear, gemm_min_tokens
from tgi_llm.quant.modes import Quantization
from tgi_llm.settings import settings
from tgi_llm.weights.safetensors_loader import NO_SHARD, Shard

logger = logging.getLogger(__name__)

class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # in float32 like transformers, so bf16/fp16 models normalize the same way
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


#: Batch-size hint for oneDNN's weight layout; the packed weight serves any batch size.
_PACK_BATCH_HINT = 32


def pack_weight_for_cpu(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` [N, K] reordered into oneDNN's blocked layout, or None where that is not possible.

    On CPU, fp32 F.linear goes to MKL sgemm, which runs no AVX-512 code on AMD CPUs; oneDNN's packed
    linear does and is ~2.3x faster at both decode and prefill batch shapes (docs/PERFORMANCE.md)."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_BATCH_HINT)
    except (RuntimeError, AttributeError) as exc:  # a torch built without these ops
        logger.warning("oneDNN weight packing unavailable (%s); using F.linear", exc)
        return None


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def float_linear_kernels(dtype: torch.dtype) -> LinearKernels | None:
    """The C kernels for float32 linears, or None for oneDNN's packed ones. Weights whose rows fill whole
    panels are held in the panel order, which the C GEMM reads in place: at or ahead of oneDNN at every row
    count on AVX-512, and faster at decode's few rows without it. They also let the fused decode stack take
    float models. TGI_LLM_FLOAT_LINEARS=onednn keeps oneDNN."""
    if dtype != torch.float32 or settings().float_linears == "onednn":
        return None
    return quant_kernels()


def whole_panels(rows: int, lanes: int) -> int:
    """`lanes` where `rows` fill whole panels of that width (the panel order), else 0 (row-major)."""
    return lanes if rows % lanes == 0 else 0


class Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.packed: torch.Tensor | None = None
        self.kernels: LinearKernels | None = None
        #: Output rows per panel when `weight` holds its elements in the kernels' panel order (0: row-major).
        self.panel_lanes = 0
        self._desc: WeightDesc | None = None

    def fits_kernels(self) -> bool:
        """Whether the C float32 kernels (quant_apply) can take this weight."""
        w = self.weight
        return w.dtype == torch.float32 and w.device.type == "cpu" and w.shape[1] % 16 == 0

    def use_kernels(self, kernels: LinearKernels, weight_dtype: torch.dtype = torch.float32) -> None:
        """Run through the C float32 kernels (after `fits_kernels`), in the panel order (rearranged in
        place: the GEMM reads it as it is) where the rows fill whole panels. With `weight_dtype` bfloat16
        such a weight is held rounded to bfloat16, in the bfloat16 panel order (quant/kernels.py)."""
        self.panel_lanes = whole_panels(self.weight.shape[0], kernels.q8_panel_lanes)
        if weight_dtype == torch.bfloat16 and self.panel_lanes:
            self.weight.data = to_bf16_panels(self.weight.detach(), self.panel_lanes, in_huge_pages)
        else:
            self.weight.data = to_panels(self.weight.detach(), self.panel_lanes, in_huge_pages)
        self.kernels = kernels

    def desc(self) -> WeightDesc:
        """Where the C kernels find this layer's weight and bias (after `use_kernels`)."""
        if self._desc is None:
            self._desc = dense_desc(self.weight.detach(), None if self.bias is None else self.bias.detach(),
                                    panel=self.panel_lanes > 0)
        return self._desc

    def pack(self) -> bool:
        """Swap the weight for its oneDNN-packed form (dropping the plain copy: no doubled memory)."""
        packed = pack_weight_for_cpu(self.weight)
        if packed is None:
            return False
        self.packed = packed
        del self.weight
        return True

    def dense_weight(self) -> torch.Tensor:
        if self.packed is not None:
            return self.packed.to_dense()
        if self.weight.dtype == torch.bfloat16 and self.kernels is not None:
            return from_bf16_panels(self.weight, self.panel_lanes)
        return from_panels(self.weight, self.panel_lanes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_linear(x, self.packed, self.bias)
        if self.kernels is not None and x.dim() == 2 and x.dtype == torch.float32:
            return self.kernels.apply(x, self.desc(), gemm_min_tokens(self.desc()))
        return F.linear(x, self.dense_weight(), self.bias)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, weights: WeightLoader, index: int, shard: Shard) -> None:
        super().__init__()
        p = f"model.layers.{index}"
        attn, mlp = f"{p}.self_attn", f"{p}.mlp"
        self.num_heads = config.num_attention_heads // shard.world_size
        self.num_kv_heads = config.num_key_value_heads // shard.world_size
        self.shard = shard
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        eps = config.rms_norm_eps
        self.input_norm = RMSNorm(weights.floats.get_tensor(f"{p}.input_layernorm.weight"), eps)
        self.post_attention_norm = RMSNorm(weights.floats.get_tensor(f"{p}.post_attention_layernorm.weight"), eps)
        qkv_names = [f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"]
        self.qkv = weights.linear(qkv_names, "column", config.qkv_bias, Linear)
        self.o_proj = weights.linear([f"{attn}.o_proj"], "row", config.o_bias, Linear)
        gate_up = [f"{mlp}.gate_proj", f"{mlp}.up_proj"]
        self.gate_up = weights.linear(gate_up, "column", config.mlp_bias, Linear)
        self.down = weights.linear([f"{mlp}.down_proj"], "row", config.mlp_bias, Linear)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        q_size, qk_heads = self.num_heads * self.head_dim, self.num_heads + self.num_kv_heads
        qkv = self.qkv(self.input_norm(hidden)).view(tokens, qk_heads + self.num_kv_heads, self.head_dim)
        # q and k rotated in one call; cos/sin are the per-forward tables of rotary_tables
        q, k = apply_rotary_tables(qkv[:, :qk_heads], cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, qk_heads:]
        o = backend.forward(q, k, v, kv_cache[0], kv_cache[1], attn, self.scale)
        hidden = hidden + tp_ops.reduce(self.o_proj(o.reshape(tokens, q_size)), self.shard)

        gate, up = self.gate_up(self.post_attention_norm(hidden)).chunk(2, dim=-1)
        return hidden + tp_ops.reduce(self.down(F.silu(gate) * up), self.shard)


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        weights: WeightLoader,
        shard: Shard = NO_SHARD,
        attention_backend: AttentionBackend | None = None,
    ) -> None:
        super().__init__()
        self.shard = shard
        self.config = config
        self.quantization = weights.quantization
        embed = weights.vocab("model.embed_tokens.weight")
        # A quantized table is a plain attribute (Module.to must not cast its codes or float16 scales).
        self.embed_quant = embed if isinstance(embed, QuantizedWeight) else None
        self.embed_tokens = None if self.embed_quant is not None else nn.Parameter(embed, requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(config, weights, i, shard) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(weights.floats.get_tensor("model.norm.weight"), config.rms_norm_eps)
        tied = config.tie_word_embeddings or "lm_head.weight" not in weights.floats
        head = embed if tied else weights.vocab("lm_head.weight")
        # The LM head as a quantized linear shares the tied embedding's codes: the weights are held once.
        self.lm_head_quant = QuantLinear(head, None) if isinstance(head, QuantizedWeight) else None
        if tied and self.lm_head_quant is not None:
            self.embed_quant = self.lm_head_quant.qweight  # the head may have reordered the codes: keep one
        if self.lm_head_quant is None:
            self.lm_head = self.embed_tokens if tied else nn.Parameter(head, requires_grad=False)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, config.max_position_embeddings)
        self.attention_backend = attention_backend
        #: Prompt attention with bfloat16 products (load_model: bfloat16 linears on an AVX512-BF16 CPU).
        self.bf16_prefill_attention = False
        self.lm_head_packed: torch.Tensor | None = None  # see prepare_cpu_linears
        self.lm_head_desc: WeightDesc | None = None  # the float head through the C kernels
        self.lm_head_panel_lanes = 0  # the float head (and a tied embedding table) in the panel order
        self.float_kernels: LinearKernels | None = None
        self._fused: tuple[list, FusedLayerStack | None] | None = None  # (the caches it was made for, it)

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def prepare_cpu_linears(self, weight_dtype: torch.dtype = torch.float32) -> str | None:
        """Choose how the float linears run on the CPU (after the final `.to()`: packed weights can't move):
        the C kernels (in their panel order where it fits), or oneDNN's packed layout (`float_linear_kernels`). Returns
        what was chosen, for the log, or None (F.linear). `weight_dtype` bfloat16: the decoder layers' weights
        held in bfloat16 for the kernels' bfloat16 GEMM (activations stay float32; see `load_model`)."""
        linears = [m for m in self.modules() if isinstance(m, Linear)]
        if not linears and self.lm_head_quant is not None:
            return None  # every linear is quantized: nothing float to place
        kernels = float_linear_kernels(self.dtype) if self.device.type == "cpu" else None
        if kernels is not None and all(m.fits_kernels() for m in linears):
            for m in linears:  # all or none: a model half in the panel order could not be packed for oneDNN
                m.use_kernels(kernels, weight_dtype)
            if self.lm_head_quant is None and self.lm_head.shape[1] % 16 == 0:
                # in place, so a tied embedding table follows: `forward` reads its rows from the panels
                if self.shard.world_size == 1:  # (a vocab-parallel shard's lookup keeps the plain order)
                    self.lm_head_panel_lanes = whole_panels(self.lm_head.shape[0], kernels.q8_panel_lanes)
                if weight_dtype == torch.bfloat16 and self.lm_head_panel_lanes:  # half the bytes a token streams
                    self.lm_head.data = to_bf16_panels(self.lm_head.detach(), self.lm_head_panel_lanes, in_huge_pages)
                else:
                    self.lm_head.data = to_panels(self.lm_head.detach(), self.lm_head_panel_lanes, in_huge_pages)
                self.lm_head_desc = dense_desc(self.lm_head.detach(), panel=self.lm_head_panel_lanes > 0)
            self.float_kernels = kernels
            panels = sum(m.panel_lanes > 0 for m in linears)
            bf16 = sum(m.weight.dtype == torch.bfloat16 for m in linears)
            return (f"float linears: C kernels ({panels} of {len(linears)} in the panel order"
                    + (f", {bf16} of them in bfloat16" if bf16 else "")
                    + (", the LM head too" if self.lm_head_quant is None and self.lm_head.dtype == torch.bfloat16
                       else "") + ")")
        return "linear weights packed for oneDNN" if self.pack_for_cpu() else None

    def pack_for_cpu(self) -> bool:
        """Pack every float linear weight for oneDNN. The LM head gets a packed copy next to the (possibly
        tied) dense one."""
        packed = [m.pack() for m in self.modules() if isinstance(m, Linear)]
        if not all(packed):
            return False
        if self.lm_head_quant is None:
            self.lm_head_packed = pack_weight_for_cpu(self.lm_head)
            return self.lm_head_packed is not None
        return bool(packed)

    def _apply(self, fn, recurse: bool = True):  # keep rope frequencies on the model's device
        result = super()._apply(fn, recurse)
        self.rotary.to(self.device)
        return result

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        attn: AttentionMetadata,
    ) -> torch.Tensor:
        """Final-norm hidden states [T, H] for a flat batch of T new tokens."""
        if self.attention_backend is None:
            self.attention_backend = select_attention_backend(input_ids.device, attn.block_size,
                                                              cpu_bf16_prefill=self.bf16_prefill_attention)
        token_seq_lens = None
        if self.rotary.needs_seq_lens:
            query_lens = torch.tensor(attn.query_lens_cpu, device=input_ids.device)
            token_seq_lens = torch.repeat_interleave(attn.seq_lens.to(input_ids.device), query_lens)
        cos, sin = rotary_tables(*self.rotary.cos_sin(positions, token_seq_lens), self.dtype)
        if self.lm_head_panel_lanes and self.embed_tokens is self.lm_head:
            flat = input_ids.reshape(-1)
            rows = bf16_panel_rows if self.embed_tokens.dtype == torch.bfloat16 else panel_rows
            hidden = rows(self.embed_tokens, flat, self.lm_head_panel_lanes).view(*input_ids.shape, -1)
        else:
            table = self.embed_quant if self.embed_quant is not None else self.embed_tokens
            hidden = tp_ops.embed(input_ids, table, self.shard).to(self.dtype)
        fused = self._layer_stack(kv_caches)
        if fused is not None and fused.takes(attn, input_ids.shape[0]):
            return fused.run(hidden, cos, sin, attn, lambda: self._layers(hidden, cos, sin, kv_caches, attn))
        return self._layers(hidden, cos, sin, kv_caches, attn)

    def _layers(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], attn: AttentionMetadata) -> torch.Tensor:
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, cos, sin, kv_cache, attn, self.attention_backend)
        return self.norm(hidden)

    def release_caches(self) -> None:
        """Forget the fused stack, which holds the K/V caches it was made for: the runner's close frees them."""
        self._fused = None

    def _layer_stack(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> FusedLayerStack | None:
        """The C layer stack (layer_stack.py), made for these caches on first use."""
        if self._fused is None or self._fused[0] is not kv_caches:
            self._fused = (kv_caches, FusedLayerStack.build(self, kv_caches))
        fused = self._fused[1]
        return fused if fused is not None and fused.agrees is not False else None

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [N, V] for the rows the sampler needs."""
        if self.lm_head_quant is not None:
            return tp_ops.gather_vocab(self.lm_head_quant(hidden).float(), self.shard)
        if self.lm_head_desc is not None and hidden.dim() == 2 and hidden.dtype == torch.float32:
            logits = self.float_kernels.apply(hidden, self.lm_head_desc, gemm_min_tokens(self.lm_head_desc))
            return tp_ops.gather_vocab(logits, self.shard)
        if self.lm_head_packed is not None:
            return tp_ops.gather_vocab(packed_linear(hidden, self.lm_head_packed, None).float(), self.shard)
        if self.lm_head.dtype == torch.bfloat16 and self.lm_head_panel_lanes:
            head = from_bf16_panels(self.lm_head, self.lm_head_panel_lanes).to(hidden.dtype)
        else:
            head = from_panels(self.lm_head, self.lm_head_panel_lanes)
        return tp_ops.gather_vocab(F.linear(hidden, head).float(), self.shard)


def describe_gguf(tensors) -> str:
    counts: dict[str, int] = {}
    for kind in tensors.types.values():
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attention_backend: AttentionBackend | None = None,
    shard: Shard = NO_SHARD,
    quantization: Quantization | None = None,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build the model from a HF directory. With no backend given, one is picked on the first forward
    (it depends on the KV block size, which the runner decides). `quantization` None: a directory
    converted from a GGUF runs the GGUF's blocks on the CPU in float32 and floats elsewhere, float
    checkpoints run in `dtype` (quant/modes.py).

    bfloat16 on the CPU, one shard, where the C kernels serve float linears: the decoder layers' weights are
    held in bfloat16 and multiplied by the kernels' bfloat16 GEMM (activations rounded to bfloat16 at each
    matmul, products summed in float32; AVX512-BF16 where the CPU has it), the LM head too where the
    vocabulary fills whole panels, and prompt attention takes bfloat16 products on AVX512-BF16 CPUs;
    everything else (norms, rope, the softmax, decode attention, the KV cache) is float32. The model then
    reports float32 (`model.dtype`).
    Quantized weights in bfloat16 (a GGUF, or --quantize named) keep their codes: decode rows read them with
    float32 products, and from BF16_GEMM_MIN_TOKENS rows the panel GEMM rounds each dequantized chunk to
    bfloat16 as the bfloat16 weights' GEMM holds them (bit for bit its products) at a quarter of the bytes.
    Except a GGUF left to the default on an AMX CPU: its tiles multiply bfloat16 weights in place.
    torch's own bfloat16 CPU linears take no BF16 instructions on AMD CPUs (docs/PERFORMANCE.md)."""
    config = ModelConfig.from_model_dir(model_dir)
    cpu_bf16 = (torch.device(device).type == "cpu" and dtype == torch.bfloat16 and shard.world_size == 1
                and (kernels := float_linear_kernels(torch.float32)) is not None)
    codes_in_bf16 = cpu_bf16 and (quantization is not None or not kernels.amx)  # where quantized weights stay
    kernels_apply = torch.device(device).type == "cpu" and (dtype == torch.float32 or codes_in_bf16)
    weights = WeightLoader(model_dir, config, quantization, shard, kernels_apply)
    bf16_weights = cpu_bf16 and not weights.quantized
    bf16_codes = codes_in_bf16 and weights.quantized
    compute_dtype = torch.float32 if bf16_weights or bf16_codes else dtype
    if weights.quantized and not kernels_apply:
        raise ValueError(f"quantized weights (--quantize {weights.quantization.mode}) run on the CPU's C kernels "
                         "with float32 activations (bfloat16 products with one shard); got device "
                         f"{device} and --dtype {str(dtype).removeprefix('torch.')} "
                         "(use --quantize float for float weights in that dtype)")
    with weights_in_huge_pages() as arena:  # QuantLinear and prepare_cpu_linears place what the kernels stream
        model = LlamaForCausalLM(config, weights, shard, attention_backend=attention_backend)
        model = model.to(device=device, dtype=compute_dtype).eval()
        if weights.quantized:
            # safetensors hands out views of its file mapping; a norm weight kept as one keeps the whole file
            # resident (540 MB of float32 pages for SmolLM2 that quantizing read once). Own copies instead.
            for p in model.parameters():
                p.data = p.data.clone()
        weight_dtype = torch.bfloat16 if bf16_weights else torch.float32
        if model.device.type == "cpu" and (chosen := model.prepare_cpu_linears(weight_dtype)):
            logger.info(chosen)
        if bf16_codes:  # the decoder layers' and the head's codes; the embedding's lookup stays exact
            for m in [*model.layers.modules(), model.lm_head_quant]:
                if isinstance(m, QuantLinear) and m.qweight.order == "panel":
                    m.take_bf16_products(BF16_GEMM_MIN_TOKENS)
    if arena is not None and arena.placed_bytes:
        logger.info("weights in huge pages: %.1f MB placed, %.1f MB of the process backed by them",
                    arena.placed_bytes / 1e6, huge_page_bytes() / 1e6)
    attention = prepare_cpu_attention(device, compute_dtype)
    model.bf16_prefill_attention = ((bf16_weights or bf16_codes) and attention is not None
                                    and attention.bf16_prefill_address is not None)
    if (weights.quantized or model.float_kernels is not None) and model.device.type == "cpu":
        layer_stack_library()  # loaded now, not on the first request's first token
    logger.info(
        "loaded %s (%s, %d layers, hidden %d) as %s on %s, weights %s",
        model_dir,
        config.model_type,
        config.num_hidden_layers,
        config.hidden_size,
        (("float32 with bfloat16 linear weights" if bf16_weights
          else f"float32 with bfloat16 products in the linears from {BF16_GEMM_MIN_TOKENS} rows")
         + (" and bfloat16 prompt attention" if model.bf16_prefill_attention else ""))
        if bf16_weights or bf16_codes else dtype,
        device,
        weights.quantization.describe() + (f" ({describe_gguf(weights.gguf)})" if weights.gguf else ""),
    )
    return model, config
