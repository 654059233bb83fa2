"""What a proposer is to the scheduler: guesses for a batch of decoding sequences, and the state it keeps
per sequence (dropped with `release`, rewound with `rewind` when the step accepted fewer guesses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tgi_llm.speculation.ngram import NgramIndex


@dataclass(frozen=True)
class DraftRequest:
    request_id: int
    token_ids: list[int]  # the sequence so far: prompt, then every generated token (the last not yet fed)
    block_ids: list[int]  # its KV block table (a draft model writes its own K/V at the same slots)
    max_tokens: int  # guess at most this many


class Proposer(Protocol):
    def propose(self, requests: list[DraftRequest]) -> list[list[int]]:
        """Guesses for each request, in order (possibly fewer than asked, or none)."""
        ...

    def rewind(self, request_id: int, num_computed: int) -> None:
        """The sequence's K/V are valid for its first `num_computed` tokens only (rejected guesses)."""
        ...

    def release(self, request_id: int) -> None: ...


class NgramProposer:
    """Prompt lookup (ngram.py), one index per sequence."""

    def __init__(self) -> None:
        self._indexes: dict[int, NgramIndex] = {}

    def propose(self, requests: list[DraftRequest]) -> list[list[int]]:
        return [self._indexes.setdefault(r.request_id, NgramIndex()).propose(r.token_ids, r.max_tokens)
                for r in requests]

    def rewind(self, request_id: int, num_computed: int) -> None:
        pass  # the index only ever holds tokens the sequence has

    def release(self, request_id: int) -> None:
        self._indexes.pop(request_id, None)
