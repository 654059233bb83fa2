"""TGI's router in one process: validation, queue, scheduler, KV blocks and the batching loop."""

from tgi_llm.engine.engine import Engine, RequestHandle
from tgi_llm.engine.limits import LimitOptions, Limits
from tgi_llm.engine.options import EngineOptions
from tgi_llm.engine.stats import EngineStats, StepStats


def build_engine(options: EngineOptions) -> Engine:
    """Load the model and size the KV cache (imports torch and transformers only when called)."""
    from tgi_llm.engine.builder import build_engine as build

    return build(options)


__all__ = [
    "Engine", "EngineOptions", "EngineStats", "LimitOptions", "Limits", "RequestHandle", "StepStats",
    "build_engine",
]
