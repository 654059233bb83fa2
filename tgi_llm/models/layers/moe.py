"""A mixture-of-experts MLP (Mixtral, Qwen3-MoE): a router picks each token's top-k experts, and each expert
runs once per step over the tokens routed to it. Each expert's gate/up and down are ordinary linears
(weight_loader: float or quantized, split across shards like a dense MLP); the caller reduces the sum."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class SparseMoe(nn.Module):
    def __init__(self, router: torch.Tensor, gate_up: list[nn.Module], down: list[nn.Module], top_k: int,
                 normalize: bool, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.router = nn.Parameter(router, requires_grad=False)  # [experts, hidden], on every shard
        self.gate_up = nn.ModuleList(gate_up)
        self.down = nn.ModuleList(down)
        self.top_k = top_k
        self.normalize = normalize  # renormalize the top-k probabilities to sum to 1 (Mixtral always)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(F.linear(x, self.router).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        for expert in experts.unique().tolist():  # the experts this step's tokens chose, each once
            token, slot = torch.where(experts == expert)
            gate, up = self.gate_up[expert](x[token]).chunk(2, dim=-1)
            out.index_add_(0, token, self.down[expert](self.act(gate) * up) * weights[token, slot, None])
        return out
