"""Choose the next token of every request in a batch, each with its own parameters (TGI semantics).

Pipeline, as TGI's HeterogeneousNextTokenChooser: repetition penalty, frequency penalty,
then for sampling rows temperature, top_k, top_p, typical_p; greedy rows take the argmax
of the penalised scores, sampling rows draw from their request's own generator. The
reported logprobs are log_softmax of the processed scores.

Token counts for the penalties live in `PenaltyState`: one dense count row per request
that uses a penalty, kept on the sampling device and updated in place each step, so no
[B, V] tensor is rebuilt from Python lists.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from tgi_llm.engine.logits_processors import (
    apply_frequency_penalty,
    apply_presence_penalty,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    apply_typical_p,
)
from tgi_llm.request import SamplingParams


def uses_penalty(p: SamplingParams) -> bool:
    """Whether the request needs token counts (register it in a PenaltyState)."""
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


def samples(p: SamplingParams) -> bool:
    """Whether the request samples. As in TGI, any non-neutral warper turns sampling on without do_sample."""
    return p.do_sample or p.temperature != 1.0 or p.top_k != 0 or p.top_p < 1.0 or p.typical_p < 1.0


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The per-request generator, kept for the request's whole life; `device` must be the logits' device."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


class PenaltyState:
    """Counts of the tokens (prompt + generated) seen by each request that uses a penalty.

    Dense float32 rows [V] in one pooled tensor on the sampling device: the engine calls
    `add` at admission (counts the prompt), `record` after every step (+1 per new token,
    one scatter on the device, no host sync) and `remove` when the request ends. A dense
    row makes the penalty a plain elementwise op; it costs 4*V bytes per penalised request
    (196 KiB for a 49k vocabulary), and requests without penalties cost nothing.
    The pool doubles when full, so views from `counts` are valid only until the next `add`.
    """

    def __init__(self, vocab_size: int, device: torch.device | str = "cpu", capacity: int = 8):
        self.vocab_size = vocab_size
        self._pool = torch.zeros(max(capacity, 1), vocab_size, dtype=torch.float32, device=device)
        self._rows: dict[Hashable, int] = {}
        self._free = list(range(self._pool.shape[0] - 1, -1, -1))

    def __contains__(self, key: Hashable) -> bool:
        return key in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, key: Hashable, prompt_ids: Sequence[int] | torch.Tensor) -> None:
        if key in self._rows:
            raise KeyError(f"request {key!r} already has penalty counts")
        if not self._free:
            self._grow()
        row = self._free.pop()
        self._rows[key] = row
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).to(self._pool.device).flatten()
        ids = ids[(ids >= 0) & (ids < self.vocab_size)]  # ids beyond the lm_head can never be generated
        self._pool[row].zero_()
        self._pool[row].index_put_((ids,), torch.ones_like(ids, dtype=torch.float32), accumulate=True)

    def remove(self, key: Hashable) -> None:
        row = self._rows.pop(key, None)
        if row is not None:
            self._free.append(row)

    def record(self, keys: Sequence[Hashable], token_ids: torch.Tensor) -> None:
        """+1 per request: `token_ids[i]` is the new token of `keys[i]`; untracked keys are skipped."""
        picked = [(i, self._rows[k]) for i, k in enumerate(keys) if k in self._rows]
        if not picked:
            return
        device = self._pool.device
        positions = torch.tensor([i for i, _ in picked], device=device)
        rows = torch.tensor([r for _, r in picked], device=device)
        tokens = token_ids.to(device=device, dtype=torch.long)[positions]
        self._pool.index_put_((rows, tokens), torch.ones_like(tokens, dtype=torch.float32), accumulate=True)

    def counts(self, keys: Sequence[Hashable]) -> list[torch.Tensor | None]:
        """Per key, its [V] count row (a view), or None when the request is not tracked."""
        return [self._pool[self._rows[k]] if k in self._rows else None for k in keys]

    def _grow(self) -> None:
        old = self._pool.shape[0]
        pool = torch.zeros(2 * old, self.vocab_size, dtype=torch.float32, device=self._pool.device)
        pool[:old] = self._pool
        self._pool = pool
        self._free.extend(range(2 * old - 1, old - 1, -1))


@dataclass
class SamplerOutput:
    next_token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32, logprob of the chosen token under the processed scores
    top_token_ids: torch.Tensor | None = None  # [B, n] best first, when top_n > 0
    top_logprobs: torch.Tensor | None = None  # [B, n]


def _rows(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    """Per-row parameters as an [R, 1] tensor that broadcasts over the vocabulary."""
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None]


def _penalize(
    scores: torch.Tensor, params: Sequence[SamplingParams], counts: Sequence[torch.Tensor | None] | None
) -> torch.Tensor:
    rows = [i for i, p in enumerate(params) if uses_penalty(p)]
    if not rows:
        return scores
    if counts is None or any(counts[i] is None for i in rows):
        raise ValueError("a request with a penalty has no token counts (add it to the PenaltyState)")
    idx = _rows(rows, scores.device)
    sub = scores.index_select(0, idx)
    seen = torch.stack([counts[i] for i in rows]).to(sub.device, sub.dtype)
    rep = [params[i].repetition_penalty for i in rows]
    if any(x != 1.0 for x in rep):
        sub = apply_repetition_penalty(sub, seen, _column(rep, sub))
    freq = [params[i].frequency_penalty for i in rows]
    if any(x != 0.0 for x in freq):
        sub = apply_frequency_penalty(sub, seen, _column(freq, sub))
    pres = [params[i].presence_penalty for i in rows]
    if any(x != 0.0 for x in pres):
        sub = apply_presence_penalty(sub, seen, torch.tensor(pres, dtype=sub.dtype, device=sub.device)[:, None])
    return scores.index_copy(0, idx, sub)


def _warp(sub: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Warpers over the sampling rows only; rows that don't use a sorting warper skip the sort."""
    temps = [p.temperature for p in params]
    if any(t != 1.0 for t in temps):
        sub = apply_temperature(sub, _column(temps, sub))
    if any(p.top_k != 0 for p in params):
        sub = apply_top_k(sub, [p.top_k for p in params])
    for warp, value in ((apply_top_p, "top_p"), (apply_typical_p, "typical_p")):
        rows = [i for i, p in enumerate(params) if getattr(p, value) < 1.0]
        if rows:
            values = [getattr(params[i], value) for i in rows]
            if len(rows) == len(params):
                sub = warp(sub, values)
            else:
                idx = _rows(rows, sub.device)
                sub = sub.index_copy(0, idx, warp(sub.index_select(0, idx), values))
    return sub


def process_logits(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    seen_token_counts: Sequence[torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """The scores tokens are chosen from: penalties for all rows, warpers for sampling rows.

    Returns `logits` itself (not a copy) when no row needs processing; never modifies it.
    """
    scores = _penalize(logits, params, seen_token_counts)
    rows = [i for i, p in enumerate(params) if samples(p)]
    if rows:
        idx = _rows(rows, scores.device)
        warped = _warp(scores.index_select(0, idx), [params[i] for i in rows])
        scores = scores.index_copy(0, idx, warped)
    return scores


class Sampler:
    """Stateless: the per-request state (generators, penalty counts) belongs to the engine."""

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        seen_token_counts: Sequence[torch.Tensor | None] | None = None,
        top_n: int = 0,
        noise: Sequence[torch.Tensor | None] | None = None,
    ) -> SamplerOutput:
        """`logits` [B, V]; `generators[i]` drives row i when it samples (None: torch's global RNG), unless
        `noise[i]` gives that row's draw (`draw_noise` of the request's generator) instead;
        `seen_token_counts[i]` is row i's count row (PenaltyState.counts), needed only for penalised rows;
        `top_n` is the largest top_n_tokens in the batch."""
        if logits.dim() != 2 or logits.shape[0] != len(params) or len(generators) != len(params):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(params)} params / generators")
        logits = logits.float()
        scores = process_logits(logits, params, seen_token_counts)
        # Greedy rows: argmax of the (penalised) scores; untouched rows are the raw logits, bit for bit.
        next_ids = scores.argmax(dim=-1)
        sample_rows = [i for i, p in enumerate(params) if samples(p)]
        if sample_rows:
            idx = _rows(sample_rows, scores.device)
            next_ids[idx] = _draw(scores.index_select(0, idx), [generators[i] for i in sample_rows],
                                  [noise[i] for i in sample_rows] if noise is not None else None)
        logprobs = torch.log_softmax(scores, dim=-1)
        chosen = logprobs.gather(1, next_ids[:, None]).squeeze(1)
        out = SamplerOutput(next_token_ids=next_ids, logprobs=chosen)
        if top_n > 0:
            top = torch.topk(logprobs, min(top_n, logprobs.shape[-1]), dim=-1)
            out.top_token_ids, out.top_logprobs = top.indices, top.values
        return out


def draw_noise(vocab_size: int, generator: torch.Generator | None, device: torch.device | str = "cpu"
               ) -> torch.Tensor:
    """One row of sampling noise: `vocab_size` Exp(1) draws from the generator, as `_draw` takes them."""
    noise = torch.empty(vocab_size, dtype=torch.float32, device=device).exponential_(1.0, generator=generator)
    # Exp(1) can return exactly 0, which would turn a filtered token's 0/0 into NaN.
    return noise.clamp_(min=torch.finfo(noise.dtype).tiny)


def _draw(scores: torch.Tensor, generators: list[torch.Generator | None],
          noise_rows: list[torch.Tensor | None] | None = None) -> torch.Tensor:
    """Sample one token per row: argmax(p / q) with q ~ Exp(1) is a draw from p (as TGI, no host sync).

    Each row's noise comes only from its own generator (or is given, drawn from it earlier), so a seed
    gives the same tokens whatever else is in the batch.
    """
    probs = torch.softmax(scores, dim=-1)
    noise = torch.empty_like(probs)
    for row, g in enumerate(generators):
        given = noise_rows[row] if noise_rows is not None else None
        noise[row] = given if given is not None else draw_noise(probs.shape[-1], g, probs.device)
    return (probs / noise).argmax(dim=-1)
