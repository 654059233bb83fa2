"""RopeOverride: TGI's --rope-scaling / --rope-factor, which stretch a model's rotary embeddings past the context it
was trained for in place of the scaling its config.json states (no torch: the launcher checks the flags)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

from tgi_llm.models.config import ModelConfig

logger = logging.getLogger(__name__)

#: --rope-scaling: TGI's two. linear divides every frequency by the factor; dynamic (NTK-aware) leaves a sequence
#: within max_position_embeddings as trained and raises the base as it grows past them (models/layers/rotary.py).
ROPE_SCALINGS = ("linear", "dynamic")


@dataclass(frozen=True)
class RopeOverride:
    scaling: str
    factor: float

    def __post_init__(self) -> None:
        if self.scaling not in ROPE_SCALINGS:
            raise ValueError(f"`--rope-scaling` must be one of {', '.join(ROPE_SCALINGS)}. Given: {self.scaling}")
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"`--rope-factor` must be > 0. Given: {self.factor}")

    @classmethod
    def from_flags(cls, scaling: str | None, factor: float | None) -> RopeOverride | None:
        """As TGI's launcher pairs them: a factor alone scales linearly, a scaling alone by 1.0; neither: None
        (the config's own rope)."""
        if scaling is None and factor is None:
            return None
        return cls(scaling or "linear", 1.0 if factor is None else float(factor))

    def context(self, max_position_embeddings: int) -> int:
        """The positions the model allows with this scaling."""
        return int(max_position_embeddings * self.factor)

    def apply(self, config: ModelConfig) -> ModelConfig:
        """The config with its rope scaling replaced, as TGI replaces `rope_scaling` whole (a GGUF's llama3
        frequency factors included); the base and partial rotation stay. max_position_embeddings stays too:
        dynamic scaling grows from it. Gemma 3's sliding layers keep their local rope: its checkpoints scale
        only the full-attention layers."""
        if config.rope.rope_type != "default" or config.rope.freq_factors:
            logger.warning("--rope-scaling %s --rope-factor %g replaces the rope scaling of the model's config (%s)",
                           self.scaling, self.factor, config.rope.rope_type if config.rope.rope_type != "default"
                           else "llama3 frequency factors")
        rope = replace(config.rope, rope_type=self.scaling, factor=self.factor, freq_factors=())
        return replace(config, rope=rope)
