"""The decoder-only causal LM every family builds, over a flat, unpadded, paged batch.

A family's ModelConfig says which parts a layer has (models/config.py: norms before and/or after each
block, q/k norms, multipliers, soft-caps, sliding windows, layers without rope, experts); on the CPU the
C layer stack (layer_stack.py) runs most of them in one call. q/k/v and gate/up are fused into
one matmul each at load time. Every linear weight is read through `WeightLoader` (weight_loader.py: float,
or quantized per `--quantize`), which takes a `Shard`: column-parallel (q/k/v, gate/up) splits output rows,
row-parallel (o, down) splits input columns, vocab-parallel splits embedding/lm_head rows. Each rank's
slice is all it reads; `tp_ops` adds the collectives (all-reduce after the row-parallel ones and the
vocab-parallel embedding, gather of the LM head's logits), which are plain local ops with one shard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tgi_llm.attention import AttentionBackend, select_attention_backend
from tgi_llm.attention.metadata import AttentionMetadata
from tgi_llm.hugepages import in_huge_pages
from tgi_llm.lora.weights import LinearLora, LoraBatch, ModelLora
from tgi_llm.models.config import ModelConfig
from tgi_llm.models.layer_stack import FusedLayerStack
from tgi_llm.models.layers.activation import activation
from tgi_llm.models.layers.linear import Linear, float_linear_kernels, pack_weight_for_cpu, packed_linear, whole_panels
from tgi_llm.models.layers.moe import SparseMoe
from tgi_llm.models.layers.norm import RMSNorm
from tgi_llm.models.layers.rotary import RotaryEmbedding, apply_rotary_tables, rotary_tables
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
from tgi_llm.quant.kernels import LinearKernels, dense_desc
from tgi_llm.quant.linear import QuantLinear, gemm_min_tokens
from tgi_llm.weights.safetensors_loader import NO_SHARD, Shard

#: The rope tables of one forward, by name: "global" for every layer, "local" for Gemma 3's sliding layers.
RopeTables = dict[str, tuple[torch.Tensor, torch.Tensor]]


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, weights: WeightLoader, index: int, shard: Shard) -> None:
        super().__init__()
        p = f"model.layers.{index}"
        attn, mlp = f"{p}.self_attn", f"{p}.mlp"
        self.num_heads = config.num_attention_heads // shard.world_size
        self.num_kv_heads = config.num_key_value_heads // shard.world_size
        self.shard = shard
        self.head_dim = config.head_dim
        self.scale = config.attention_scale if config.attention_scale is not None else config.head_dim**-0.5
        self.window = config.window(index)
        self.softcap = config.attn_logit_softcap
        self.residual_multiplier = config.residual_multiplier
        self.act = activation(config.hidden_act)
        #: Which rope tables this layer rotates q and k with (None: no rope in this layer).
        self.rope = None if not config.uses_rope(index) else (
            "local" if config.local_rope is not None and self.window is not None else "global")

        def norm(name: str | None) -> RMSNorm | None:
            if name is None:
                return None
            weight = weights.floats.get_tensor(f"{name}.weight")
            return RMSNorm(weight + config.norm_offset if config.norm_offset else weight, config.rms_norm_eps)

        names = config.norms
        self.input_norm = norm(names.attn_in and f"{p}.{names.attn_in}")
        self.attn_out_norm = norm(names.attn_out and f"{p}.{names.attn_out}")
        self.mlp_norm = norm(names.mlp_in and f"{p}.{names.mlp_in}")
        self.mlp_out_norm = norm(names.mlp_out and f"{p}.{names.mlp_out}")
        self.qk_norm = config.qk_norm
        self.q_norm = norm(config.qk_norm and f"{attn}.q_norm")
        self.k_norm = norm(config.qk_norm and f"{attn}.k_norm")
        q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
        if config.fused_qkv:
            self.qkv = weights.fused_linear(f"{attn}.qkv_proj", [q, kv, kv], config.qkv_bias, Linear)
        else:
            qkv_names = [f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"]
            self.qkv = weights.linear(qkv_names, "column", config.qkv_bias, Linear)
        self.o_proj = weights.linear([f"{attn}.o_proj"], "row", config.o_bias, Linear)
        self.moe = None
        if config.moe is not None and config.moe.sparse_layers[index]:
            self.moe = _experts(config, weights, p)
        elif config.fused_gate_up:
            inter = config.intermediate_size
            self.gate_up = weights.fused_linear(f"{mlp}.gate_up_proj", [inter, inter], config.mlp_bias, Linear)
        else:
            self.gate_up = weights.linear([f"{mlp}.gate_proj", f"{mlp}.up_proj"], "column", config.mlp_bias, Linear)
        if self.moe is None:
            self.down = weights.linear([f"{mlp}.down_proj"], "row", config.mlp_bias, Linear)
        #: The LoRA adapters of this layer's linears, by attribute name (CausalLM.attach_lora; None: no LoRA).
        self.lora: dict[str, LinearLora] | None = None

    def _project(self, name: str, x: torch.Tensor, lora: LoraBatch | None) -> torch.Tensor:
        """The linear `name` over every row, plus each row's adapter product where it runs one."""
        y = getattr(self, name)(x)
        if lora is not None and self.lora is not None and name in self.lora:
            self.lora[name].add(x, y, lora)
        return y

    def _attention_input(self, hidden: torch.Tensor, rope: RopeTables, lora: LoraBatch | None
                         ) -> tuple[torch.Tensor, ...]:
        """q [T, Hq, D], k and v [T, Hkv, D]: normalized and rotated as the family does."""
        tokens = hidden.shape[0]
        x = self.input_norm(hidden) if self.input_norm is not None else hidden
        qkv = self._project("qkv", x, lora)
        qk_heads = self.num_heads + self.num_kv_heads
        if self.qk_norm == "projection":  # over all heads of q, and of k (one shard: checked at start-up)
            q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            qkv = torch.cat((self.q_norm(q), self.k_norm(k), v), dim=-1)
        qkv = qkv.view(tokens, qk_heads + self.num_kv_heads, self.head_dim)
        qk = qkv[:, :qk_heads]
        if self.qk_norm == "head":
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), dim=1)
        if self.rope is not None:  # q and k rotated in one call; the per-forward tables of rotary_tables
            qk = apply_rotary_tables(qk, *rope[self.rope])
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        return q, k, qkv[:, qk_heads:]

    def _residual(self, hidden: torch.Tensor, out: torch.Tensor, out_norm: RMSNorm | None) -> torch.Tensor:
        if out_norm is not None:
            out = out_norm(out)
        if self.residual_multiplier != 1.0:
            out = out * self.residual_multiplier
        return hidden + out

    def forward(
        self,
        hidden: torch.Tensor,
        rope: RopeTables,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata,
        backend: AttentionBackend,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self._attention_input(hidden, rope, lora)
        o = backend.forward(q, k, v, kv_cache[0], kv_cache[1], attn, self.scale, window=self.window,
                            softcap=self.softcap)
        o = tp_ops.reduce(self._project("o_proj", o.reshape(tokens, self.num_heads * self.head_dim), lora),
                          self.shard)
        hidden = self._residual(hidden, o, self.attn_out_norm)

        x = self.mlp_norm(hidden) if self.mlp_norm is not None else hidden
        if self.moe is not None:
            return self._residual(hidden, tp_ops.reduce(self.moe(x), self.shard), self.mlp_out_norm)
        gate, up = self._project("gate_up", x, lora).chunk(2, dim=-1)
        down = self._project("down", self.act(gate) * up, lora)
        return self._residual(hidden, tp_ops.reduce(down, self.shard), self.mlp_out_norm)


def _experts(config: ModelConfig, weights: WeightLoader, layer: str) -> SparseMoe:
    moe = config.moe
    p = f"{layer}.{moe.prefix}"
    gate, up, down = moe.names
    return SparseMoe(
        weights.floats.get_tensor(f"{p}.gate.weight"),
        [weights.linear([f"{p}.experts.{e}.{gate}", f"{p}.experts.{e}.{up}"], "column", False, Linear)
         for e in range(moe.num_experts)],
        [weights.linear([f"{p}.experts.{e}.{down}"], "row", False, Linear) for e in range(moe.num_experts)],
        moe.top_k, moe.normalize, activation(config.hidden_act))


class CausalLM(nn.Module):
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
        final_norm = weights.floats.get_tensor("model.norm.weight")
        self.norm = RMSNorm(final_norm + config.norm_offset if config.norm_offset else final_norm,
                            config.rms_norm_eps)
        tied = config.tie_word_embeddings or "lm_head.weight" not in weights.floats
        head = embed if tied else weights.vocab("lm_head.weight")
        # The LM head as a quantized linear shares the tied embedding's codes: the weights are held once.
        self.lm_head_quant = QuantLinear(head, None) if isinstance(head, QuantizedWeight) else None
        if tied and self.lm_head_quant is not None:
            self.embed_quant = self.lm_head_quant.qweight  # the head may have reordered the codes: keep one
        if self.lm_head_quant is None:
            self.lm_head = self.embed_tokens if tied else nn.Parameter(head, requires_grad=False)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, config.max_position_embeddings)
        self.local_rotary = (None if config.local_rope is None else
                             RotaryEmbedding(config.local_rope, config.head_dim, config.max_position_embeddings))
        self.attention_backend = attention_backend
        #: Prompt attention with bfloat16 products (load_model: bfloat16 linears on an AVX512-BF16 CPU).
        self.bf16_prefill_attention = False
        self.lm_head_packed: torch.Tensor | None = None  # see prepare_cpu_linears
        self.lm_head_desc: WeightDesc | None = None  # the float head through the C kernels
        self.lm_head_panel_lanes = 0  # the float head (and a tied embedding table) in the panel order
        self.float_kernels: LinearKernels | None = None
        self._fused: tuple[list, FusedLayerStack | None] | None = None  # (the caches it was made for, it)
        #: The resident LoRA adapters' weights (attach_lora; None: the server takes no adapters).
        self.lora: ModelLora | None = None

    @staticmethod
    def lora_targets() -> None:
        """The linears adapters may change: the family's own (lora/targets.py)."""
        return None

    def attach_lora(self, lora: ModelLora) -> None:
        """Give every layer its adapter slots (before the first forward: the fused stack reads them once)."""
        self.lora = lora
        for layer, linears in zip(self.layers, lora.layers, strict=True):
            layer.lora = linears
        self._fused = None

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
        if self.local_rotary is not None:
            self.local_rotary.to(self.device)
        return result

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        attn: AttentionMetadata,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states [T, H] for a flat batch of T new tokens (`lora`: each row's adapter)."""
        if self.attention_backend is None:
            self.attention_backend = select_attention_backend(input_ids.device, attn.block_size,
                                                              cpu_bf16_prefill=self.bf16_prefill_attention)
        rope = self._rope_tables(positions, attn)
        if self.lm_head_panel_lanes and self.embed_tokens is self.lm_head:
            flat = input_ids.reshape(-1)
            rows = bf16_panel_rows if self.embed_tokens.dtype == torch.bfloat16 else panel_rows
            hidden = rows(self.embed_tokens, flat, self.lm_head_panel_lanes).view(*input_ids.shape, -1)
        else:
            table = self.embed_quant if self.embed_quant is not None else self.embed_tokens
            hidden = tp_ops.embed(input_ids, table, self.shard).to(self.dtype)
        if self.config.embedding_multiplier != 1.0:
            hidden = hidden * self.config.embedding_multiplier
        fused = self._layer_stack(kv_caches)
        if fused is not None and fused.takes(attn, input_ids.shape[0]):
            return fused.run(hidden, rope, attn, lambda: self._layers(hidden, rope, kv_caches, attn, lora), lora)
        return self._layers(hidden, rope, kv_caches, attn, lora)

    def _rope_tables(self, positions: torch.Tensor, attn: AttentionMetadata) -> RopeTables:
        token_seq_lens = None
        if self.rotary.needs_seq_lens:
            query_lens = torch.tensor(attn.query_lens_cpu, device=positions.device)
            token_seq_lens = torch.repeat_interleave(attn.seq_lens.to(positions.device), query_lens)
        tables = {"global": rotary_tables(*self.rotary.cos_sin(positions, token_seq_lens), self.dtype)}
        if self.local_rotary is not None:
            tables["local"] = rotary_tables(*self.local_rotary.cos_sin(positions, token_seq_lens), self.dtype)
        return tables

    def _layers(self, hidden: torch.Tensor, rope: RopeTables, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                attn: AttentionMetadata, lora: LoraBatch | None = None) -> torch.Tensor:
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, rope, kv_cache, attn, self.attention_backend, lora)
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
        """float32 logits [N, V] for the rows the sampler needs, scaled and soft-capped as the family does."""
        logits = self._head(hidden)
        if self.config.logits_divisor != 1.0:
            logits = logits / self.config.logits_divisor
        if (cap := self.config.final_logit_softcap) is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
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


