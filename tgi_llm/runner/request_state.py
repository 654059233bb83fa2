"""The runner's one record per live request: what sampling needs across steps (rank 0 only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tgi_llm.engine.sampling import PenaltyState, make_generator, samples, uses_penalty
from tgi_llm.request import ValidRequest


@dataclass
class RequestState:
    request: ValidRequest
    #: The request's own random stream: advanced only by steps that sample for it, so a seed gives the
    #: same tokens whatever the batch, the chunking or the prefix cache did.
    generator: torch.Generator | None
    #: Where the request's grammar stands (llguidance matcher), None without a grammar.
    matcher: Any = None


class RequestStates:
    """Records created when a request first appears in a plan, dropped when a plan releases it."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.device = device
        self.penalties = PenaltyState(vocab_size, device)  # token counts of requests that use a penalty
        self._states: dict[int, RequestState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def get(self, request_id: int, request: ValidRequest) -> RequestState:
        state = self._states.get(request_id)
        if state is None:
            p = request.sampling
            generator = make_generator(p.seed, self.device) if samples(p) else None
            matcher = request.grammar.matcher() if request.grammar is not None else None
            state = self._states[request_id] = RequestState(request, generator, matcher)
            if uses_penalty(p):
                self.penalties.add(request_id, request.input_ids)
        return state

    def release(self, request_id: int) -> None:
        if self._states.pop(request_id, None) is not None:
            self.penalties.remove(request_id)
