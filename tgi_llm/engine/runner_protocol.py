"""What the engine needs from a model runner; the real one and test fakes both fit it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tgi_llm.engine.step_plan import StepPlan


@dataclass
class SeqResult:
    """One sequence's outcome of a step: the sampled next token (when the step samples it) with what
    `details` and `top_n_tokens` ask for, and the logprobs of this chunk's prompt tokens when asked."""

    token_id: int = -1
    logprob: float = 0.0
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)
    #: Logprobs of the prompt tokens this chunk's rows predict (decoder_input_details), in order.
    prompt_logprobs: list[float] | None = None
    #: With top_n_tokens: the best alternatives at each of those rows (ids, logprobs), best first.
    prompt_top: list[tuple[list[int], list[float]]] | None = None
    #: The sampled token completed the request's grammar (the end-of-sequence it forces): the request ends.
    grammar_done: bool = False
    #: The request cannot go on (its grammar cannot be followed): it ends with this error, its token dropped.
    error: str | None = None


class Runner(Protocol):
    def execute(self, plan: StepPlan) -> list[SeqResult | None]:
        """One forward over the plan; one result per `plan.seqs` entry (None where the entry neither
        samples nor asked for prompt logprobs). Drops the state of `plan.released` requests first."""
        ...

    def close(self) -> None: ...
