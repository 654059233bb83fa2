"""The step contract: what the scheduler decided for one forward, exactly as the runner executes it.

For every sequence in the step: which tokens it feeds (`num_tokens` of them, from position `start`),
its KV blocks, whether this step samples its next token, and whether the logits of its prompt rows are
wanted. A prompt may take several steps (chunked prefill); only the step that computes its last token
samples. A decode feeds the last sampled token, followed by the draft tokens speculation guessed
(`num_drafts`, speculation/): the runner samples at each of those 1 + num_drafts rows and keeps the
drafts that match what it sampled, plus one token.

The plan's order is part of the contract: decodes without drafts first, then decodes with drafts, then
prompt chunks (the fused layer stack runs the leading one-row sequences as decodes and the rest as
chunks). The runner, the sharded plan codec and the tests consume exactly this; nobody re-derives "is
this a prefill?" from a sequence's state, and every shard rank reads the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tgi_llm.lora.registry import LoraLoad
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
    #: The tokens fed follow a sampled one (a decode, with its drafts), rather than being prompt.
    is_decode: bool = False
    #: The last `num_drafts` tokens fed are guesses: the step samples at each of the 1 + num_drafts rows.
    num_drafts: int = 0
    #: The LoRA slot whose adapter this sequence runs (-1: the base model).
    lora_slot: int = -1
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
    def num_sampled_rows(self) -> int:
        """Rows whose logits choose a token: the last 1 + num_drafts when the step samples, else none."""
        return 1 + self.num_drafts if self.samples else 0

    @property
    def drafts(self) -> list[int]:
        return self.token_ids[len(self.token_ids) - self.num_drafts:]


@dataclass
class StepPlan:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    #: Requests that ended since the last plan: the runner and the shards drop their per-request state.
    released: list[int] = field(default_factory=list)
    #: Adapters to read into their LoRA slots before this forward (registry.py).
    lora_loads: list[LoraLoad] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)
