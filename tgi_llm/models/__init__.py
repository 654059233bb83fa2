"""Model code: config parsing, the family registry, the layers, the decoder every family builds.

`ModelConfig` and the registry import no torch (the launcher reads configs); `CausalLM` and `load_model` are
imported on first use."""

from typing import Any

from tgi_llm.models.config import ModelConfig, kv_cache_bytes_per_token

__all__ = ["CausalLM", "ModelConfig", "kv_cache_bytes_per_token", "load_model"]


def __getattr__(name: str) -> Any:
    if name == "CausalLM":
        from tgi_llm.models.decoder import CausalLM

        return CausalLM
    if name == "load_model":
        from tgi_llm.models.loader import load_model

        return load_model
    raise AttributeError(name)
