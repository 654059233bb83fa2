"""Granite (3.x): Llama with four multipliers: on the embeddings, on each block's output before the residual
add, as the attention scale, and a divisor on the logits."""

from __future__ import annotations

from typing import Any

from tgi_llm.models.family import Family


def _granite(cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        "embedding_multiplier": float(cfg.get("embedding_multiplier", 1.0)),
        "residual_multiplier": float(cfg.get("residual_multiplier", 1.0)),
        "attention_scale": float(cfg.get("attention_multiplier", 1.0)),
        "logits_divisor": float(cfg.get("logits_scaling", 1.0)),
    }


GRANITE = Family("granite", ("granite",), ("GraniteForCausalLM",), _granite)
