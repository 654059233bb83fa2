"""Batched logits processors: penalties and warpers with one parameter per row.

Each function takes `scores` [R, V] and a per-row parameter tensor [R, 1] and returns
new scores; inputs are never modified. A row whose parameter is neutral comes out
bit-identical (x * 1, x / 1 and x - 0 are exact), so callers may pass mixed rows.
The warpers follow transformers' single-request warpers exactly (same comparisons,
same tie handling), which is what TGI's Heterogeneous* warpers also do.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor
_NEG_INF = float("-inf")


def apply_repetition_penalty(scores: Tensor, counts: Tensor, penalty: Tensor) -> Tensor:
    """CTRL penalty on every token seen at least once: score<0 ? score*p : score/p."""
    penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(counts > 0, penalized, scores)


def apply_frequency_penalty(scores: Tensor, counts: Tensor, penalty: Tensor) -> Tensor:
    """OpenAI frequency penalty: score -= penalty * count(token)."""
    return scores - counts * penalty


def apply_presence_penalty(scores: Tensor, counts: Tensor, penalty: Tensor) -> Tensor:
    """OpenAI presence penalty: score -= penalty for every token seen at least once."""
    return scores - (counts > 0).to(scores.dtype) * penalty


def apply_temperature(scores: Tensor, temperature: Tensor) -> Tensor:
    return scores / temperature


def apply_top_k(scores: Tensor, top_k: list[int]) -> Tensor:
    """Keep tokens scoring >= the k-th best (ties kept, as transformers); k=0 disables the row."""
    vocab = scores.shape[-1]
    ks = [min(k, vocab) for k in top_k]
    max_k = max(ks)
    if max_k == 0:
        return scores
    device = scores.device
    index = torch.tensor([max(k - 1, 0) for k in ks], device=device).unsqueeze(1)
    kth = torch.topk(scores, max_k, dim=-1).values.gather(1, index)
    if 0 in ks:
        disabled = torch.tensor([k == 0 for k in ks], device=device).unsqueeze(1)
        kth = kth.masked_fill(disabled, _NEG_INF)
    return scores.masked_fill(scores < kth, _NEG_INF)


def apply_top_p(scores: Tensor, top_p: list[float]) -> Tensor:
    """Keep the smallest set of best tokens whose probability reaches top_p (at least one).

    Only pass rows with top_p < 1: a neutral row would still lose tokens whose probability
    underflows to 0, which transformers (warper not applied) would keep.
    """
    # 1 - p in float64 then cast, as transformers compares a float32 tensor with a Python float.
    cutoff = torch.tensor([1.0 - p for p in top_p], dtype=scores.dtype, device=scores.device).unsqueeze(1)
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= cutoff
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(1, sorted_indices, remove_sorted)
    return scores.masked_fill(remove, _NEG_INF)


def apply_typical_p(scores: Tensor, mass: list[float]) -> Tensor:
    """Locally typical sampling, as transformers' TypicalLogitsWarper. Pass only rows with mass < 1."""
    mass_t = torch.tensor(mass, dtype=scores.dtype, device=scores.device).unsqueeze(1)
    normalized = torch.log_softmax(scores, dim=-1)
    p = torch.exp(normalized)
    entropy = -(normalized * p).nansum(-1, keepdim=True)
    shifted = torch.abs(-normalized - entropy)
    sorted_scores, sorted_indices = torch.sort(shifted, descending=False)
    cumulative = scores.gather(-1, sorted_indices).softmax(dim=-1).cumsum(dim=-1)
    last_ind = (cumulative < mass_t).sum(dim=1).clamp_(max=sorted_scores.shape[-1] - 1)
    remove_sorted = sorted_scores > sorted_scores.gather(1, last_ind.view(-1, 1))
    remove_sorted[..., :1] = False
    remove = remove_sorted.scatter(1, sorted_indices, remove_sorted)
    return scores.masked_fill(remove, _NEG_INF)
