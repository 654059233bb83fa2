"""TGI v3 `next_batch` semantics over a FIFO queue, for a batch that prefill and decode share.

Each engine step asks `schedule()` which waiting sequences join the running ones. New sequences are
admitted only when the budgets allow (prefill tokens, total tokens, KV blocks, batch size) and,
while a batch runs, only when enough are waiting (`waiting_served_ratio`) or the queue has waited
`max_waiting_tokens` steps. Admitted sequences are prefilled in the same forward as the decodes.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field

from tgi_llm.engine.block_allocator import BlockAllocator
from tgi_llm.engine.limits import Limits
from tgi_llm.engine.sequence import Sequence, SequenceStatus

logger = logging.getLogger(__name__)


@dataclass
class SchedulerOutput:
    prefill: list[Sequence] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.prefill and not self.decode

    @property
    def num_tokens(self) -> int:
        return sum(s.input_length for s in self.prefill) + len(self.decode)


class Scheduler:
    def __init__(self, limits: Limits, allocator: BlockAllocator) -> None:
        self.limits = limits
        self.allocator = allocator
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        #: Steps since sequences were last admitted (TGI's `waiting_tokens`).
        self.waiting_steps = 0

    @property
    def batch_max_tokens(self) -> int:
        return sum(s.max_tokens for s in self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> SchedulerOutput:
        lim = self.limits
        if not self.running:
            admitted = self.next_batch(None, lim.max_batch_size, lim.max_batch_prefill_tokens,
                                       lim.max_batch_total_tokens)
        else:
            batch_size = len(self.running)
            min_size = None
            if self.waiting_steps < lim.max_waiting_tokens:
                min_size = math.floor(batch_size * lim.waiting_served_ratio)
            max_size = None if lim.max_batch_size is None else max(lim.max_batch_size - batch_size, 0)
            token_budget = max(lim.max_batch_total_tokens - self.batch_max_tokens, 0)
            admitted = self.next_batch(min_size, max_size, lim.max_batch_prefill_tokens, token_budget)
        decode = list(self.running)
        if admitted:
            self.waiting_steps = 0
        if decode or admitted:
            self.waiting_steps += 1
        for seq in admitted:
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        return SchedulerOutput(prefill=admitted, decode=decode)

    def next_batch(
        self, min_size: int | None, max_size: int | None, prefill_token_budget: int, token_budget: int
    ) -> list[Sequence]:
        """Pop sequences from the front of the queue while they fit; all or nothing w.r.t. min_size."""
        if not self.waiting:
            return []
        if min_size is not None and len(self.waiting) < min_size:
            return []
        if max_size == 0:
            return []
        bs = self.limits.block_size
        prefill_token_budget = -(-prefill_token_budget // bs) * bs
        batch: list[Sequence] = []
        prefill_tokens = decode_tokens = 0
        while self.waiting:
            seq = self.waiting[0]
            prefill_tokens += seq.input_length
            decode_tokens += seq.request.stopping.max_new_tokens
            if prefill_tokens > prefill_token_budget or prefill_tokens + decode_tokens > token_budget:
                logger.debug("Over budget: prefill_tokens=%d > %d || %d + %d > %d", prefill_tokens,
                             prefill_token_budget, prefill_tokens, decode_tokens, token_budget)
                break
            # The last generated token is never fed back, so its K/V needs no slot.
            allocation = self.allocator.allocate(seq.max_tokens - 1)
            if allocation is None:
                logger.debug("Over budget: not enough free blocks")
                break
            self.waiting.popleft()
            seq.allocation = allocation
            batch.append(seq)
            if max_size is not None and len(batch) == max_size:
                break
        if min_size is not None and len(batch) < min_size:
            for seq in reversed(batch):
                self._release(seq)
                self.waiting.appendleft(seq)
            return []
        return batch

    def finish(self, seq: Sequence) -> None:
        """Take a sequence out of the batch or the queue and give its blocks back."""
        seq.status = SequenceStatus.FINISHED
        if seq in self.running:
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        if seq.allocation is not None:
            self.allocator.free(seq.allocation)
            seq.allocation = None
