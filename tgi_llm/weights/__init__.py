"""Model weights: find or build a local HF directory, then read its tensors.

Names are imported on first use (PEP 562): the launcher and the front only need a constant or two from
here and must not pull in torch, safetensors and gguf with them.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "convert_gguf": "tgi_llm.weights.gguf",
    "DEFAULT_MODEL_ID": "tgi_llm.weights.resolve",
    "default_cache_dir": "tgi_llm.weights.resolve",
    "default_gguf_path": "tgi_llm.weights.resolve",
    "resolve_model_dir": "tgi_llm.weights.resolve",
    "NO_SHARD": "tgi_llm.weights.safetensors_loader",
    "SafetensorsWeights": "tgi_llm.weights.safetensors_loader",
    "Shard": "tgi_llm.weights.safetensors_loader",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
