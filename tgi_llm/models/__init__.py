"""Model code: config parsing, the family registry, the layers, the decoder every family builds."""

from tgi_llm.models.config import ModelConfig, kv_cache_bytes_per_token
from tgi_llm.models.decoder import CausalLM
from tgi_llm.models.loader import load_model

__all__ = ["CausalLM", "ModelConfig", "kv_cache_bytes_per_token", "load_model"]
