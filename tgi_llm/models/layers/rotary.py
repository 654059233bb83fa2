"""Rotary position embeddings: the HF rope variants, computed from positions on the fly.

cos/sin are built once per forward (shared by all layers) from the token positions, so
there is no cache to grow and a flat batch of unrelated sequences costs nothing extra.
"""

from __future__ import annotations

import math

import torch

from tgi_llm.models.rope_config import FREQ_FACTORS_KEY, RopeConfig


def _base_inv_freq(theta: float | torch.Tensor, dim: int) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (theta**exponents)


def _llama3_inv_freq(rope: RopeConfig, dim: int) -> torch.Tensor:
    inv_freq = _base_inv_freq(rope.theta, dim)
    old_ctx = rope.original_max_position_embeddings
    low_wavelen = old_ctx / rope.low_freq_factor
    high_wavelen = old_ctx / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    factor, base = rope.factor, rope.theta
    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = get_mscale(factor, rope.mscale) / get_mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)

    def correction_dim(rotations: float) -> float:
        orig = rope.original_max_position_embeddings
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _longrope_inv_freq(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(short, long) frequencies and the cos/sin scale, as transformers' longrope (Phi-3's long contexts)."""
    for name, factors in (("short_factor", rope.short_factor), ("long_factor", rope.long_factor)):
        if len(factors) != dim // 2:
            raise ValueError(f"longrope `{name}` must have {dim // 2} entries (half the rotary dimension). "
                             f"Given: {len(factors)}")
    attention_factor = rope.attention_factor
    if attention_factor is None:
        attention_factor = 1.0 if rope.factor <= 1.0 else math.sqrt(
            1 + math.log(rope.factor) / math.log(rope.original_max_position_embeddings))
    powers = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim)
    short = 1.0 / (torch.tensor(rope.short_factor, dtype=torch.float32) * powers)
    long = 1.0 / (torch.tensor(rope.long_factor, dtype=torch.float32) * powers)
    return short, long, float(attention_factor)


class RotaryEmbedding:
    """Neox-style (rotate-half) RoPE over [T, heads, head_dim] tensors: over the first `dim` dimensions of
    each head (all of them unless the config rotates a fraction)."""

    def __init__(self, rope: RopeConfig, head_dim: int, max_position_embeddings: int, device=None) -> None:
        self.rope = rope
        self.dim = int(head_dim * rope.partial_factor)
        self.max_position_embeddings = max_position_embeddings
        self.attention_scaling = 1.0
        self.long_inv_freq: torch.Tensor | None = None
        if rope.rope_type == "llama3":
            inv_freq = _llama3_inv_freq(rope, self.dim)
        elif rope.rope_type == "yarn":
            inv_freq, self.attention_scaling = _yarn_inv_freq(rope, self.dim)
        elif rope.rope_type == "longrope":
            inv_freq, self.long_inv_freq, self.attention_scaling = _longrope_inv_freq(rope, self.dim)
        else:
            inv_freq = _base_inv_freq(rope.theta, self.dim)
            if rope.rope_type == "linear":
                inv_freq = inv_freq / rope.factor
        if rope.freq_factors:
            if len(rope.freq_factors) != self.dim // 2:
                raise ValueError(f"`{FREQ_FACTORS_KEY}` must have {self.dim // 2} entries (half the rotary "
                                 f"dimension). Given: {len(rope.freq_factors)}")
            inv_freq = inv_freq / torch.tensor(rope.freq_factors, dtype=torch.float32)
        self.inv_freq = inv_freq.to(device)
        if self.long_inv_freq is not None:
            self.long_inv_freq = self.long_inv_freq.to(device)

    def to(self, device) -> RotaryEmbedding:
        self.inv_freq = self.inv_freq.to(device)
        if self.long_inv_freq is not None:
            self.long_inv_freq = self.long_inv_freq.to(device)
        return self

    def _dynamic_inv_freq(self, token_seq_lens: torch.Tensor) -> torch.Tensor:
        """[T, dim/2]: each token's frequencies from its own sequence's length, as transformers does for
        one sequence (base grows once the sequence passes max_position_embeddings), but per sequence so
        that a token's rotation never depends on what else is in the batch."""
        max_pos, factor = self.max_position_embeddings, self.rope.factor
        seq_len = token_seq_lens.to(torch.float32).clamp(min=max_pos)
        base = self.rope.theta * ((factor * seq_len / max_pos) - (factor - 1)) ** (self.dim / (self.dim - 2))
        exponents = torch.arange(0, self.dim, 2, dtype=torch.int64, device=base.device).float() / self.dim
        return 1.0 / (base[:, None] ** exponents[None, :])

    def cos_sin(
        self, positions: torch.Tensor, token_seq_lens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin, each [T, dim/2]. `token_seq_lens` (the length of each token's sequence) is
        needed by dynamic and longrope scaling only."""
        if self.rope.rope_type == "dynamic" and token_seq_lens is not None:
            freqs = positions.to(torch.float32)[:, None] * self._dynamic_inv_freq(token_seq_lens)
        elif self.long_inv_freq is not None and token_seq_lens is not None:
            # each sequence past the original context takes the long factors, as transformers does per forward
            long = (token_seq_lens > self.rope.original_max_position_embeddings)[:, None]
            freqs = positions.to(torch.float32)[:, None] * torch.where(long, self.long_inv_freq, self.inv_freq)
        else:
            freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        return freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling

    @property
    def needs_seq_lens(self) -> bool:
        return self.rope.rope_type in ("dynamic", "longrope")


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos/sin: [T, D/2] float32. Same arithmetic as transformers' rotate_half form."""
    half = x.shape[-1] // 2
    cos = cos.to(x.dtype)[:, None, :]
    sin = sin.to(x.dtype)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rotary_tables(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin from `cos_sin` prepared once per forward for every layer: [T, 1, D] in the activations'
    dtype, sin carrying the rotate-half sign, so `apply_rotary_tables` is one cat, two muls and an add
    (not seven kernels per call) and q and k can be rotated in one call."""
    cos = cos.to(dtype)
    sin = sin.to(dtype)
    return torch.cat((cos, cos), dim=-1)[:, None, :], torch.cat((-sin, sin), dim=-1)[:, None, :]


def apply_rotary_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos/sin from `rotary_tables`. Bit for bit `apply_rotary`: x1*c + x2*(-s) is x1*c - x2*s.
    Tables narrower than D rotate the first dimensions and pass the rest through (partial rotary)."""
    rot = cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat((apply_rotary_tables(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)
    half = rot // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin
