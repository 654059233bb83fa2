"""What the engine needs from a model runner; the real one and test fakes both fit it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tgi_llm.engine.step_plan import StepPlan


@dataclass
class SampledToken:
    """A token the step chose, with what `details` and `top_n_tokens` ask for."""

    token_id: int
    logprob: float = 0.0
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)


@dataclass
class SeqResult:
    """One sequence's outcome of a step: the tokens it chose (when the step samples: the drafts it
    accepted, then the one it sampled after them) and the logprobs of this chunk's prompt tokens when
    asked."""

    tokens: list[SampledToken] = field(default_factory=list)
    #: Logprobs of the prompt tokens this chunk's rows predict (decoder_input_details), in order.
    prompt_logprobs: list[float] | None = None
    #: With top_n_tokens: the best alternatives at each of those rows (ids, logprobs), best first.
    prompt_top: list[tuple[list[int], list[float]]] | None = None
    #: The last token completed the request's grammar (the end-of-sequence it forces): the request ends.
    grammar_done: bool = False
    #: The request cannot go on (its grammar cannot be followed): it ends with this error, its tokens dropped.
    error: str | None = None
    #: How many draft tokens the step verified (accepted ones are the first len(tokens) - 1 tokens).
    num_drafts: int = 0

    @property
    def num_accepted(self) -> int:
        return max(len(self.tokens) - 1, 0) if self.num_drafts else 0


class Runner(Protocol):
    def execute(self, plan: StepPlan) -> list[SeqResult | None]:
        """One forward over the plan; one result per `plan.seqs` entry (None where the entry neither
        samples nor asked for prompt logprobs). Drops the state of `plan.released` requests first."""
        ...

    def close(self) -> None: ...
