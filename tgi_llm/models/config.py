"""ModelConfig: the architecture facts the runner needs, read from a HF config.json."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tgi_llm.models.rope import RopeConfig

logger = logging.getLogger(__name__)

#: model_types that are the Llama architecture (GQA, RoPE, RMSNorm, SwiGLU) under another name.
LLAMA_FAMILY = ("llama", "mistral", "qwen2")
_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: q/k/v have a bias, o_proj does not
    o_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None  # read but not applied
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        model_type = cfg.get("model_type", "")
        archs = set(cfg.get("architectures") or [])
        if model_type not in LLAMA_FAMILY and not archs & _ARCHITECTURES:
            raise ValueError(
                f"model_type {model_type!r} (architectures {sorted(archs)}) is not supported; "
                f"supported: {', '.join(LLAMA_FAMILY)}"
            )
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} not supported (Llama family uses silu)")
        heads = cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads {heads} not a multiple of num_key_value_heads {kv_heads}")
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        attention_bias = bool(cfg.get("attention_bias", False))
        is_qwen2 = model_type == "qwen2" or "Qwen2ForCausalLM" in archs
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        sliding = cfg.get("sliding_window")
        if is_qwen2 and not cfg.get("use_sliding_window", False):
            sliding = None
        if sliding is not None and sliding < cfg.get("max_position_embeddings", 0):
            logger.warning(
                "sliding_window=%s is ignored: attention spans the whole context (exact up to the window)",
                sliding,
            )
        return cls(
            model_type=model_type,
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(cfg),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=True if is_qwen2 else attention_bias,
            o_bias=False if is_qwen2 else attention_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            sliding_window=sliding,
            raw=dict(cfg),
        )

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ModelConfig:
        return cls.from_dict(json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8")))


def kv_cache_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """K and V, every layer, every KV head: what one cached token costs."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element


def attention_cost_per_context_token(config: ModelConfig) -> float:
    """What attending to one more token of context costs a token, as a fraction of its linears: q.k and p.v
    take 4 * heads * head_dim FLOPs per context token per layer; the layer's linears take 2 per weight. A
    prompt chunk's tokens late in a long prompt cost ~1.5x its first ones (SmolLM2, 1,500 tokens)."""
    h, d = config.hidden_size, config.head_dim
    per_layer = (h * config.num_attention_heads * d * 2 + h * config.num_key_value_heads * d * 2
                 + 3 * h * config.intermediate_size)
    return 4 * config.num_attention_heads * d / (2 * per_layer)
