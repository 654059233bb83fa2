"""The state of one request from admission to its final event."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from tgi_llm.engine.block_allocator import BlockAllocation
from tgi_llm.events import Event, Token
from tgi_llm.request import ValidRequest


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: int
    request: ValidRequest
    on_event: Callable[[Event], None]
    status: SequenceStatus = SequenceStatus.WAITING
    allocation: BlockAllocation | None = None
    #: Prompt followed by every generated token.
    token_ids: list[int] = field(default_factory=list)
    #: How many of token_ids have their K/V in the cache.
    num_computed: int = 0
    tokens: list[Token] = field(default_factory=list)
    top_tokens: list[list[Token]] = field(default_factory=list)
    text: str = ""
    queued_at: float = field(default_factory=time.monotonic)
    admitted_at: float | None = None
    cancelled: bool = False

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.request.input_ids)

    @property
    def input_length(self) -> int:
        return self.request.input_length

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.request.input_length

    @property
    def max_tokens(self) -> int:
        """What TGI counts against the batch token budget: prompt plus every token it may generate."""
        return self.request.input_length + self.request.stopping.max_new_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_computed == 0
