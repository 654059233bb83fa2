"""RopeConfig: a checkpoint's rotary-embedding settings as config.json states them (no torch: the launcher reads
configs too). models/layers/rotary.py computes the embeddings from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tgi_llm.weights.gguf_config import FREQ_FACTORS_KEY

__all__ = ["FREQ_FACTORS_KEY", "SUPPORTED_ROPE_TYPES", "RopeConfig"]

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: cos/sin scale; None = derived from factor
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn
    short_factor: tuple[float, ...] = ()  # longrope: per-frequency divisors up to the original context
    long_factor: tuple[float, ...] = ()  # longrope: past it
    partial_factor: float = 1.0  # the fraction of each head's dimensions that rotates (Phi-4-mini: 0.75)
    #: llama.cpp's per-frequency divisors (a GGUF's `rope_freqs`: Llama 3's scaling), from a converted GGUF.
    freq_factors: tuple[float, ...] = ()

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], params: dict[str, Any] | None = None) -> RopeConfig:
        """From config.json: transformers 5 writes `rope_parameters`, older configs `rope_theta` +
        `rope_scaling` (with `type` or `rope_type`). `params`: one layer type's entry where the config has one
        per layer type (Gemma 3's sliding and full layers)."""
        if params is None:
            params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        params = dict(params)
        theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope type {rope_type!r} not supported (supported: {SUPPORTED_ROPE_TYPES})")
        partial = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
        if not 0.0 < partial <= 1.0:
            raise ValueError(f"`partial_rotary_factor` must be in (0, 1]. Given: {partial}")
        orig = params.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
        if rope_type in ("llama3", "yarn", "longrope") and orig is None:
            orig = cfg.get("max_position_embeddings")

        def num(key: str, default: float | None) -> float | None:
            value = params.get(key)
            return default if value is None else float(value)

        factor = num("factor", 1.0)
        if rope_type in ("yarn", "longrope") and params.get("factor") is None and orig:
            factor = cfg["max_position_embeddings"] / orig
        return cls(
            theta=float(theta),
            rope_type=rope_type,
            factor=float(factor),
            original_max_position_embeddings=orig,
            low_freq_factor=float(num("low_freq_factor", 1.0)),
            high_freq_factor=float(num("high_freq_factor", 4.0)),
            beta_fast=float(num("beta_fast", 32.0)),
            beta_slow=float(num("beta_slow", 1.0)),
            attention_factor=num("attention_factor", None),
            mscale=num("mscale", None),
            mscale_all_dim=num("mscale_all_dim", None),
            truncate=bool(params.get("truncate", True)),
            short_factor=tuple(float(f) for f in params.get("short_factor") or ()),
            long_factor=tuple(float(f) for f in params.get("long_factor") or ()),
            partial_factor=partial,
            freq_factors=tuple(float(f) for f in cfg.get(FREQ_FACTORS_KEY) or ()),
        )
