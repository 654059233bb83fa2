"""SmolLM3: Llama whose `no_rope_layers` (1: rope, 0: none) leave some layers without position encoding."""

from __future__ import annotations

from typing import Any

from tgi_llm.models.family import Family


def _smollm3(cfg: dict[str, Any]) -> dict[str, Any]:
    layers = cfg["num_hidden_layers"]
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = cfg.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(flags) != layers:
        raise ValueError(f"`no_rope_layers` must have one entry per layer ({layers}). Given: {len(flags)}")
    return {"rope_layers": tuple(bool(f) for f in flags)}


SMOLLM3 = Family("smollm3", ("smollm3",), ("SmolLM3ForCausalLM",), _smollm3)
