"""Constrained decoding in the sampler: the logits of rows whose request has a grammar are masked to the
tokens the grammar allows next, before penalties and warpers; after sampling each matcher advances by its
token. Rows without a grammar are not touched (their tokens stay what they would be alone).

The masks of the whole batch are computed in one call on llguidance's own thread pool, into one reusable
int32 bitmask (a bit per token, little-endian within each word). A sequence verifying draft tokens gets a
mask for each of its rows: the one after its tokens so far, then the one after each draft token (llguidance
advances a matcher through the drafts and rolls it back).
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

    def mask(self, logits: torch.Tensor, rows: list[int], matchers: list[Any],
             drafts: list[list[int]] | None = None) -> None:
        """In place: rows[i] of `logits` ([B, V], float32, CPU or CUDA) keeps only what matchers[i] allows;
        with `drafts`, rows[i] + 1 + j keeps what it allows after drafts[i][:j + 1] (every draft must be
        one the matcher accepts: `valid_drafts`).

        Not llguidance.torch: importing it runs torch.compile, which pulls in inductor (and, inside Triton's
        stub, fails on the stub's ASCII locale); unpacking the bits is all it takes."""
        import llguidance

        t0 = time.perf_counter()
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        words = (self.vocab_size + 31) // 32
        if drafts is not None and any(drafts):
            targets = [row + j for row, d in zip(rows, drafts, strict=True) for j in range(1 + len(d))]
        else:
            targets, drafts = rows, None
        if self._bitmask is None or self._bitmask.shape[0] < len(targets):
            self._bitmask = np.zeros((max(len(targets), 8), words), dtype=np.int32)
        bitmask = self._bitmask[: len(targets)]
        if drafts is None:
            self._executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bitmask.ctypes.data,
                                                   words * 4, len(targets))
        else:
            firsts = [0]
            for d in drafts[:-1]:
                firsts.append(firsts[-1] + 1 + len(d))
            # llguidance refuses an empty draft: matchers without one take the plain call.
            plain = [(m, k) for m, k, d in zip(matchers, firsts, drafts, strict=True) if not d]
            if plain:
                self._executor.unsafe_compute_mask_ptr(plain, bitmask.ctypes.data, words * 4, len(targets))
            self._executor.unsafe_compute_mask_ptr_with_draft_token(
                [(m, k, d) for m, k, d in zip(matchers, firsts, drafts, strict=True) if d], bitmask.ctypes.data,
                words * 4, len(targets))
        rows = targets
        # Inverted words unpack straight to "blocked" bytes of 0/1, read as bool: no comparison pass.
        bits = np.unpackbits(np.invert(bitmask).view(np.uint8), axis=1, bitorder="little")[:, : logits.shape[1]]
        blocked = torch.from_numpy(bits).view(torch.bool).to(logits.device)
        if rows == list(range(logits.shape[0])):  # every row constrained (the usual batch): one in-place pass
            logits.masked_fill_(blocked, float("-inf"))
        else:
            index = torch.tensor(rows, dtype=torch.long, device=logits.device)
            logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(blocked, float("-inf")))
        self.mask_times_s.append(time.perf_counter() - t0)

    @staticmethod
    def valid_drafts(matcher: Any, drafts: list[int]) -> list[int]:
        """The leading draft tokens the grammar allows: a forbidden one ends the draft, and so does one
        that would end the grammar (nothing is verified past the end)."""
        if not drafts or matcher.is_error():
            return []
        valid = drafts[: matcher.validate_tokens(drafts)]
        if not valid:
            return []
        matcher.consume_tokens(valid)
        stopped = matcher.is_stopped()
        matcher.rollback(len(valid))
        return valid[:-1] if stopped else valid

    def advance(self, matchers: list[Any], tokens: list[list[int]]) -> list[bool | str]:
        """Consume each matcher's chosen tokens, in order. Per matcher: True where its last token ended its
        grammar (the forced end-of-sequence after a complete match), which ends the request even with
        ignore_eos; False where it goes on; or the reason the grammar cannot be followed (a matcher that
        failed computing its mask, or that refused a token: a parser limit hit by a recursive schema),
        which ends the request with an error: its output so far does not match the grammar."""
        outcomes: list[bool | str] = []
        for matcher, chosen in zip(matchers, tokens, strict=True):
            for token in chosen:
                if matcher.is_error():
                    break
                matcher.consume_token(token)
            token = chosen[-1]
            if matcher.is_error():
                reason = error_line(matcher.get_error())
                logger.warning("a request's grammar cannot be followed: %s", reason)
                outcomes.append(f"the grammar cannot be followed: {reason}")
            else:
                outcomes.append(matcher.is_stopped() and token in self.eos_token_ids)
        return outcomes
