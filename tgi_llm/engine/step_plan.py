"""The step contract: what the scheduler decided for one forward, exactly as the runner executes it.

For every sequence in the step: which tokens it feeds (`num_tokens` of them, from position `start`),
its KV blocks, whether this step samples its next token, and whether the logits of its prompt rows are
wanted. A prompt may take several steps (chunked prefill); only the step that computes its last token
samples. The runner, the sharded plan codec and the tests consume exactly this; nobody re-derives
"is this a prefill?" from a sequence's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tgi_llm.request import ValidRequest


@dataclass(frozen=True)
class ScheduledSeq:
    request_id: int
    start: int  # position of the first token fed this step (= tokens whose K/V are cached before it)
    token_ids: list[int]  # the tokens fed: num_scheduled_tokens of them
    block_ids: list[int]  # the sequence's whole block table (shared with the KV manager: read only)
    samples: bool  # this step computes the last known token, so it samples the next one
    #: Logits of this chunk's prompt rows are wanted (decoder_input_details): every row but the sampled one.
    prompt_logprobs: bool = False
    #: Rank 0 only (None on shard ranks, which run the forward and nothing else): sampling parameters.
    request: ValidRequest | None = field(default=None, compare=False)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def end(self) -> int:
        """Context length after this step."""
        return self.start + len(self.token_ids)

    @property
    def is_decode(self) -> bool:
        """One token that follows a sampled one (as opposed to a chunk of the prompt)."""
        return self.request is not None and self.start >= self.request.input_length


@dataclass
class StepPlan:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    #: Requests that ended since the last plan: the runner and the shards drop their per-request state.
    released: list[int] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)
