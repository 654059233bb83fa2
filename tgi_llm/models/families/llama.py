"""Llama (1-3, SmolLM2), Mistral (its sliding window applied) and Qwen2/2.5 (biases on q/k/v only)."""

from __future__ import annotations

from typing import Any

from tgi_llm.models.family import Family


def _llama(cfg: dict[str, Any]) -> dict[str, Any]:
    return {}


def _qwen2(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"qkv_bias": True, "o_bias": False, **qwen_windows(cfg)}


def qwen_windows(cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen's configs slide only with `use_sliding_window`, which defaults to false."""
    return {} if cfg.get("use_sliding_window", False) else {"sliding_windows": ()}


LLAMA = Family("llama", ("llama",), ("LlamaForCausalLM",), _llama)
MISTRAL = Family("mistral", ("mistral",), ("MistralForCausalLM",), _llama)
QWEN2 = Family("qwen2", ("qwen2",), ("Qwen2ForCausalLM",), _qwen2)
