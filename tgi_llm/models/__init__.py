"""Model code: config parsing, rotary embeddings, the Llama-family model."""

from tgi_llm.models.config import ModelConfig, kv_cache_bytes_per_token
from tgi_llm.models.llama import LlamaForCausalLM, load_model

__all__ = ["LlamaForCausalLM", "ModelConfig", "kv_cache_bytes_per_token", "load_model"]
