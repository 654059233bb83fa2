"""Gemma, Gemma 2 and Gemma 3 (text): GeGLU, norms scaling by (1 + w), embeddings scaled by sqrt(hidden);
Gemma 2 and 3 add a norm after each block too, an attention scale from `query_pre_attn_scalar` and
sliding-window layers; Gemma 2 soft-caps attention scores and logits; Gemma 3 normalizes q and k per head
and gives its sliding layers their own rope base."""

from __future__ import annotations

from typing import Any

from tgi_llm.models.config import NormNames
from tgi_llm.models.family import Family
from tgi_llm.models.rope_config import RopeConfig

_SANDWICH = NormNames(attn_in="input_layernorm", attn_out="post_attention_layernorm",
                      mlp_in="pre_feedforward_layernorm", mlp_out="post_feedforward_layernorm")


def _gemma(cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        "hidden_act": cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh",
        "norm_offset": 1.0,
        "embedding_multiplier": float(cfg["hidden_size"]) ** 0.5,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
    }


def _alternating_windows(cfg: dict[str, Any], pattern: int) -> dict[str, Any]:
    """Configs written before transformers 5 have no `layer_types`: every `pattern`-th layer attends to the
    whole context, the others to the window (Gemma 2: every other layer; Gemma 3: `sliding_window_pattern`)."""
    if cfg.get("layer_types") or not cfg.get("sliding_window"):
        return {}
    window = cfg["sliding_window"]
    return {"sliding_windows": tuple(window if (i + 1) % pattern else None for i in range(cfg["num_hidden_layers"]))}


def _gemma2(cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        **_gemma(cfg),
        **_alternating_windows(cfg, 2),
        "norms": _SANDWICH,
        "attention_scale": float(cfg.get("query_pre_attn_scalar") or cfg.get("head_dim") or 256) ** -0.5,
        "attn_logit_softcap": cfg.get("attn_logit_softcapping"),
        "final_logit_softcap": cfg.get("final_logit_softcapping"),
    }


def _gemma3(cfg: dict[str, Any]) -> dict[str, Any]:
    fields = {**_gemma2(cfg), "qk_norm": "head",
              **_alternating_windows(cfg, int(cfg.get("sliding_window_pattern") or 6))}
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5: one entry per layer type
        fields["rope"] = RopeConfig.from_hf(cfg, params["full_attention"])
        fields["local_rope"] = RopeConfig.from_hf(cfg, params.get("sliding_attention") or {"rope_theta": 10000.0})
    else:  # older configs: rope_theta/rope_scaling for full layers, rope_local_base_freq for sliding ones
        fields["local_rope"] = RopeConfig(theta=float(cfg.get("rope_local_base_freq", 10000.0)))
    return fields


GEMMA = Family("gemma", ("gemma",), ("GemmaForCausalLM",), _gemma)
GEMMA2 = Family("gemma2", ("gemma2",), ("Gemma2ForCausalLM",), _gemma2)
GEMMA3 = Family("gemma3", ("gemma3_text",), ("Gemma3ForCausalLM",), _gemma3)
