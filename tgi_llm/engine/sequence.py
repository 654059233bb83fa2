"""The state of one request from submission to its final event, owned by the engine thread.

The sequence holds its tokens, how many of them have K/V in the cache, its detokenizer and stop state,
and what it produced (per-token logprobs, text deltas, top tokens, prompt logprobs). `Scheduler.update`
advances it once per step; the postprocessor only reads it to build events.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from tgi_llm.engine.detokenizer import IncrementalDetokenizer
from tgi_llm.engine.stopping import StopChecker
from tgi_llm.events import Event, FinishReason
from tgi_llm.request import ValidRequest
from tgi_llm.speculation import DraftLength


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: int
    request: ValidRequest
    on_event: Callable[[Event], None]
    #: Built by the engine at submission; None only for sequences that never sample (scheduler tests).
    detokenizer: IncrementalDetokenizer | None = None
    stop: StopChecker | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    #: Prompt followed by every generated token.
    token_ids: list[int] = field(default_factory=list)
    #: How many of token_ids have their K/V in the cache.
    num_computed: int = 0
    #: Prompt tokens whose K/V came from the prefix cache (set at admission).
    num_cached: int = 0
    logprobs: list[float] = field(default_factory=list)  # per generated token
    deltas: list[str] = field(default_factory=list)  # text each generated token added
    top: list[tuple[list[int], list[float]]] = field(default_factory=list)  # when top_n_tokens
    prompt_logprobs: list[float] = field(default_factory=list)  # of prompt tokens 1.., decoder_input_details
    prompt_top: list[tuple[list[int], list[float]]] = field(default_factory=list)  # with top_n_tokens too
    finish_reason: FinishReason | None = None
    queued_at: float = field(default_factory=time.monotonic)
    admitted_at: float | None = None
    #: With speculation: how many tokens the sequence guesses next, and how often it guessed right.
    draft_length: DraftLength | None = None
    #: Draft tokens verified for this sequence, and how many of them were accepted (TGI's skipped tokens).
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    #: The model's LoRA slot its adapter occupies while it runs (-1: the base model, or not admitted).
    lora_slot: int = -1

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.request.input_ids)
        #: Equal for equal prompts (n choices, best_of, retries): such twins share one prefill (scheduler).
        self.prompt_key = hash((self.request.cache_key, self.request.input_ids))

    @property
    def input_length(self) -> int:
        return self.request.input_length

    @property
    def text(self) -> str:
        """The generated text. Joined when asked (once, for the final event): a string grown per token would
        be copied whole at every token."""
        return "".join(self.deltas)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.request.input_length

    @property
    def max_tokens(self) -> int:
        """What TGI counts against the batch token budget: prompt plus every token it may generate."""
        return self.request.input_length + self.request.stopping.max_new_tokens

    @property
    def num_pending(self) -> int:
        """Known tokens whose K/V are not computed yet: the rest of the prompt, or the last sampled token."""
        return len(self.token_ids) - self.num_computed

    @property
    def cache_lookup(self) -> bool:
        """Prompt logprobs need every prompt row computed: such requests skip the prefix cache."""
        return not self.request.decoder_input_details

    @property
    def cache_key(self) -> bytes:
        return self.request.cache_key

    @property
    def lora_name(self) -> str | None:
        return self.request.lora.name if self.request.lora is not None else None

    def append_token(self, token_id: int, logprob: float, top_ids: list[int], top_logprobs: list[float],
                     grammar_done: bool = False) -> str:
        """Record one sampled token: detokenize, check the stop criteria (sets `finish_reason`). Returns the
        text it adds, with any held-back text flushed when it ends the sequence."""
        assert self.detokenizer is not None and self.stop is not None, "a sampling sequence needs its detokenizer"
        delta = self.detokenizer.step(token_id)
        reason = self.stop.check(token_id, delta, grammar_done)
        if reason is not None:
            delta += self.detokenizer.finish()
            self.finish_reason = reason
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
        self.deltas.append(delta)
        if self.request.top_n_tokens:
            self.top.append((top_ids, top_logprobs))
        return delta
