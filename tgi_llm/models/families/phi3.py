"""Phi-3 and Phi-4-mini: Llama with q/k/v and gate/up stored fused, a sliding window on every layer where the
config sets one, longrope scaling and (Phi-4-mini) rope on a fraction of each head."""

from __future__ import annotations

from typing import Any

from tgi_llm.models.family import Family


def _phi3(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"fused_qkv": True, "fused_gate_up": True}


PHI3 = Family("phi3", ("phi3",), ("Phi3ForCausalLM",), _phi3)
