"""A smaller model with the target's tokenizer guesses the next tokens (`--speculative-model`).

The draft model keeps its own KV pool, laid out like the target's (same block size and number of blocks),
and writes each sequence's K/V at the slots of the sequence's own block table: no allocator of its own,
and its lookahead fits the blocks the target reserved at admission. Per sequence it remembers how many
tokens its K/V cover; a sequence's first guesses compute its whole context (prefix-cache blocks the
target reused hold no draft K/V of this request's making), later ones only what was accepted since.

One proposal is `max_tokens` forwards of the draft model over every guessing sequence together: the
first feeds what the draft has not seen (its catch-up and the last token), each next one the previous
guess. Guesses are greedy, so the target's verification (runner/model_runner.py) keeps output exactly
what `--speculate 0` gives, greedy or seeded.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from tgi_llm.engine.step_plan import ScheduledSeq, StepPlan
from tgi_llm.speculation.proposer import DraftRequest

logger = logging.getLogger(__name__)


class DraftModelProposer:
    def __init__(self, runner: Any, vocab_size: int) -> None:
        """`runner`: a ModelRunner over the draft model and its own KV pool; `vocab_size`: the target's (a
        draft's padded vocabulary never proposes a token the target does not have)."""
        self.runner = runner
        self.vocab_size = vocab_size
        self._computed: dict[int, int] = {}  # request id -> tokens whose draft K/V are written

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in requests]
        active = [i for i, r in enumerate(requests) if r.max_tokens > 0 and r.token_ids]
        entries = {}
        for i in active:
            r = requests[i]
            start = min(self._computed.get(r.request_id, 0), len(r.token_ids) - 1)
            entries[i] = ScheduledSeq(r.request_id, start, r.token_ids[start:], r.block_ids, samples=True,
                                      is_decode=len(r.token_ids) - start == 1)
        while entries:
            # One-token entries first: the order the fused layer stack runs (step_plan.py).
            order = sorted(entries, key=lambda i: entries[i].num_tokens > 1)
            _, logits = self.runner.forward_plan(StepPlan([entries[i] for i in order]))
            guesses = logits[:, : self.vocab_size].argmax(dim=-1).tolist()
            following = {}
            for i, guess in zip(order, guesses, strict=True):
                entry, r = entries[i], requests[i]
                self._computed[r.request_id] = entry.end
                out[i].append(guess)
                if len(out[i]) < r.max_tokens:
                    following[i] = ScheduledSeq(r.request_id, entry.end, [guess], r.block_ids, samples=True,
                                                is_decode=True)
            entries = following
        return out

    def rewind(self, request_id: int, num_computed: int) -> None:
        if request_id in self._computed:
            self._computed[request_id] = min(self._computed[request_id], num_computed)

    def release(self, request_id: int) -> None:
        self._computed.pop(request_id, None)
