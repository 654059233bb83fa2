"""The runner's one record per live request: what sampling needs across steps (rank 0 only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tgi_llm.engine.sampling import PenaltyState, draw_noise, make_generator, samples, uses_penalty
from tgi_llm.request import ValidRequest


@dataclass
class RequestState:
    request: ValidRequest
    #: The request's own random stream: one row of noise per generated token, in order, so a seed gives
    #: the same tokens whatever the batch, the chunking, the prefix cache or speculation did.
    generator: torch.Generator | None
    #: Where the request's grammar stands (llguidance matcher), None without a grammar.
    matcher: Any = None
    #: Noise rows drawn for tokens not chosen yet: a verify draws one per row it may accept, and gives
    #: back those past the first rejection for the next step's first tokens.
    noise_ahead: list[torch.Tensor] = field(default_factory=list)

    def take_noise(self, n: int, vocab_size: int, device: torch.device) -> list[torch.Tensor]:
        """The noise of the request's next `n` tokens."""
        rows = self.noise_ahead[:n]
        del self.noise_ahead[:n]
        rows += [draw_noise(vocab_size, self.generator, device) for _ in range(n - len(rows))]
        return rows

    def give_back_noise(self, rows: list[torch.Tensor]) -> None:
        self.noise_ahead[:0] = rows


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
