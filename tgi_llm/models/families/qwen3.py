"""Qwen3: Llama with an RMSNorm over each head of q and k before rope, and no q/k/v biases."""

from __future__ import annotations

from typing import Any

from tgi_llm.models.families.llama import qwen_windows
from tgi_llm.models.family import Family


def _qwen3(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"qk_norm": "head", **qwen_windows(cfg)}


QWEN3 = Family("qwen3", ("qwen3",), ("Qwen3ForCausalLM",), _qwen3)
