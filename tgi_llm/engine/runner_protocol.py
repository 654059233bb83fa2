"""What the engine needs from a model runner; the real one and test fakes both fit it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tgi_llm.engine.sequence import Sequence


@dataclass
class SeqResult:
    """The sampled next token of one sequence, with what `details` and `top_n_tokens` ask for."""

    token_id: int
    logprob: float
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)
    #: Logprobs of prompt tokens 1..n-1 given their prefix (only when decoder_input_details).
    prompt_logprobs: list[float] | None = None


class Runner(Protocol):
    def execute(self, batch: list[Sequence]) -> list[SeqResult]:
        """One forward over every sequence in `batch`: sequences with num_computed == 0 are
        prefilled (all their tokens), the others decode their last token."""
        ...

    def release(self, request_id: int) -> None:
        """Forget per-request state (sampling generator, penalty counts)."""
        ...

    def close(self) -> None: ...
