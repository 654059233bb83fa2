"""The ModelConfig of a checkpoint no native family serves, as transformers reads its config.json, or why it
cannot be served through transformers' modeling code either (transformers_backed.py serves the rest). No
torch: the launcher reads configs too."""

from __future__ import annotations

from typing import Any

from tgi_llm.models.config import ModelConfig
from tgi_llm.models.rope_config import RopeConfig

FAMILY = "transformers"


def _refusal(cfg: Any) -> str | None:
    """Why transformers' code for this config cannot be served here (None: it can be tried)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if getattr(cfg, "is_encoder_decoder", False):
        return "it is an encoder-decoder model"
    if cfg.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "transformers has no causal LM of this type"
    if any(hasattr(cfg, name) for name in ("vision_config", "audio_config", "text_config")):
        return "it takes multimodal inputs"  # (its own attribute has no heads: checked first, to say why)
    if not getattr(cfg, "num_attention_heads", None):
        return "it has no attention layers"
    other = set(getattr(cfg, "layer_types", None) or ()) - {"full_attention", "sliding_attention"}
    if other:
        return f"it has layers that are not attention ({', '.join(sorted(other))})"
    return None


def backed_config(raw: dict[str, Any], why_not_native: str) -> ModelConfig:
    """The facts the engine needs (KV cache shape, context) from transformers' reading of the config, or a
    ValueError saying why the checkpoint cannot be served at all."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.for_model(**raw)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{why_not_native}; transformers does not know it either ({exc})") from None
    refusal = _refusal(cfg)
    if refusal is not None:
        raise ValueError(f"{why_not_native}; not served through transformers either: {refusal}")
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return ModelConfig(
        model_type=cfg.model_type, family=FAMILY, hidden_size=cfg.hidden_size,
        intermediate_size=getattr(cfg, "intermediate_size", None) or 4 * cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=heads,
        num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads, head_dim=head_dim,
        vocab_size=cfg.vocab_size, rms_norm_eps=1e-6, rope=RopeConfig(),
        max_position_embeddings=getattr(cfg, "max_position_embeddings", None) or 2048,
        tensor_parallel_refusal="a model served through transformers' modeling code runs on one shard",
        raw=dict(raw),
    )
