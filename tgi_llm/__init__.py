"""Hugging Face text-generation-inference, rebuilt in Python for NVIDIA Triton's Python backend."""

from tgi_llm.errors import OverloadedError, TgiError, ValidationError

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy: `import tgi_llm` must not pull torch/transformers (the launcher validates flags first).
    if name in ("LLM", "GenerationResult"):
        from tgi_llm import llm

        return getattr(llm, name)
    raise AttributeError(name)


__all__ = ["LLM", "GenerationResult", "OverloadedError", "TgiError", "ValidationError", "__version__"]
