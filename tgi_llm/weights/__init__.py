"""Model weights: find or build a local HF directory, then read its tensors."""

from tgi_llm.weights.gguf import convert_gguf
from tgi_llm.weights.resolve import (
    DEFAULT_MODEL_ID,
    default_cache_dir,
    default_gguf_path,
    resolve_model_dir,
)
from tgi_llm.weights.safetensors_loader import NO_SHARD, SafetensorsWeights, Shard

__all__ = [
    "DEFAULT_MODEL_ID",
    "NO_SHARD",
    "SafetensorsWeights",
    "Shard",
    "convert_gguf",
    "default_cache_dir",
    "default_gguf_path",
    "resolve_model_dir",
]
