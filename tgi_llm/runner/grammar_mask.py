"""Constrained decoding in the sampler: the logits of rows whose request has a grammar are masked to the
tokens the grammar allows next, before penalties and warpers; after sampling each matcher advances by its
token. Rows without a grammar are not touched (their tokens stay what they would be alone).

The masks of the whole batch are computed in one call on llguidance's own thread pool, into one reusable
int32 bitmask (a bit per token, little-endian within each word).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from tgi_llm.engine.grammar import error_line

logger = logging.getLogger(__name__)


class GrammarMasker:
    def __init__(self, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._executor: Any = None
        self._bitmask: torch.Tensor | None = None
        self.mask_times_s: deque[float] = deque(maxlen=4096)  # per masked step, drained for the metrics

    def mask(self, logits: torch.Tensor, rows: list[int], matchers: list[Any]) -> None:
        """In place: rows[i] of `logits` ([B, V], float32, CPU or CUDA) keeps only what matchers[i] allows.

        Not llguidance.torch: importing it runs torch.compile, which pulls in inductor (and, inside Triton's
        stub, fails on the stub's ASCII locale); unpacking the bits is all it takes."""
        import llguidance

        t0 = time.perf_counter()
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        words = (self.vocab_size + 31) // 32
        if self._bitmask is None or self._bitmask.shape[0] < len(rows):
            self._bitmask = np.zeros((max(len(rows), 8), words), dtype=np.int32)
        bitmask = self._bitmask[: len(rows)]
        self._executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bitmask.ctypes.data,
                                               words * 4, len(rows))
        # Inverted words unpack straight to "blocked" bytes of 0/1, read as bool: no comparison pass.
        bits = np.unpackbits(np.invert(bitmask).view(np.uint8), axis=1, bitorder="little")[:, : logits.shape[1]]
        blocked = torch.from_numpy(bits).view(torch.bool).to(logits.device)
        if rows == list(range(logits.shape[0])):  # every row constrained (the usual batch): one in-place pass
            logits.masked_fill_(blocked, float("-inf"))
        else:
            index = torch.tensor(rows, dtype=torch.long, device=logits.device)
            logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(blocked, float("-inf")))
        self.mask_times_s.append(time.perf_counter() - t0)

    def advance(self, matchers: list[Any], tokens: list[int]) -> list[bool | str]:
        """Consume each sampled token. Per matcher: True where the token ended its grammar (the forced
        end-of-sequence after a complete match), which ends the request even with ignore_eos; False where
        it goes on; or the reason the grammar cannot be followed (a matcher that failed computing its mask,
        or that refused the token: a parser limit hit by a recursive schema), which ends the request with an
        error: its output so far does not match the grammar."""
        outcomes: list[bool | str] = []
        for matcher, token in zip(matchers, tokens, strict=True):
            if not matcher.is_error():
                matcher.consume_token(token)
            if matcher.is_error():
                reason = error_line(matcher.get_error())
                logger.warning("a request's grammar cannot be followed: %s", reason)
                outcomes.append(f"the grammar cannot be followed: {reason}")
            else:
                outcomes.append(matcher.is_stopped() and token in self.eos_token_ids)
        return outcomes
