"""The collectives Megatron-style tensor parallelism puts inside the model (default process group).

With one shard every function is the plain local op, so the model code reads the same either way.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tgi_llm.quant.formats import QuantizedWeight
from tgi_llm.weights.safetensors_loader import Shard


def reduce(x: torch.Tensor, shard: Shard) -> torch.Tensor:
    """Sum the partial outputs of a row-parallel linear (o_proj, down_proj) across ranks."""
    if shard.world_size > 1:
        dist.all_reduce(x)
    return x


def _lookup(ids: torch.Tensor, weight: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    if isinstance(weight, QuantizedWeight):  # dequantize just the rows asked for
        return weight.dequantize(ids.reshape(-1)).view(*ids.shape, weight.in_features)
    return F.embedding(ids, weight)


def embed(input_ids: torch.Tensor, weight: torch.Tensor | QuantizedWeight, shard: Shard) -> torch.Tensor:
    """Vocab-parallel embedding: each rank holds rows [rank * n, (rank + 1) * n) of the table, looks up
    the ids it owns, zeroes the rest, and the all-reduce fills every row from its owner (exactly)."""
    if shard.world_size == 1:
        return _lookup(input_ids, weight)
    rows = weight.shape[0]
    local = input_ids - shard.rank * rows
    outside = (local < 0) | (local >= rows)
    out = _lookup(local.masked_fill(outside, 0), weight)
    out.masked_fill_(outside.unsqueeze(-1), 0.0)
    dist.all_reduce(out)
    return out


def gather_vocab(logits: torch.Tensor, shard: Shard) -> torch.Tensor:
    """Vocab-parallel LM head: rank 0 gets the full [N, V] logits (it alone samples); the other ranks
    keep their [N, V / world] slice, which nobody reads."""
    if shard.world_size == 1:
        return logits
    logits = logits.contiguous()
    if shard.rank != 0:
        dist.gather(logits, None, dst=0)
        return logits
    parts = [torch.empty_like(logits) for _ in range(shard.world_size)]
    dist.gather(logits, parts, dst=0)
    return torch.cat(parts, dim=-1)
