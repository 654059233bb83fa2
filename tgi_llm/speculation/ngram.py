"""Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's last n tokens.

Edits, rewrites, quoted summaries, code changes and RAG answers repeat spans of their input, so where the
last few tokens occurred before, what followed them there is often what comes next. The longest suffix
that occurred before wins (1..`max_ngram` tokens, longest first), at its latest occurrence: the most
recent context is the likeliest to continue the same way.

Each sequence keeps a dict from every n-gram it holds to where that n-gram last ended, extended as tokens
are appended, so a proposal is `max_ngram` dict lookups whatever the context length (vLLM's KMP search
and TGI's scan re-read the whole context each step). The prompt is indexed once, at the first proposal,
with the loops in C (dict.update over zips).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NgramIndex:
    max_ngram: int = 4
    min_ngram: int = 1
    #: n-gram (a tuple of 1..max_ngram token ids) -> the position of its last token, latest occurrence.
    _ends: dict[tuple[int, ...], int] = field(default_factory=dict)
    #: n-grams ending at positions < _indexed are in `_ends`.
    _indexed: int = 0

    def propose(self, tokens: list[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` guesses for what follows `tokens` (the sequence so far); [] when its last
        tokens never occurred before."""
        if max_tokens <= 0 or len(tokens) < 2:
            return []
        last = len(tokens) - 1
        self._index(tokens, last)  # every n-gram ending before the last token: earlier occurrences only
        ends = self._ends
        for n in range(min(self.max_ngram, last), self.min_ngram - 1, -1):
            end = ends.get(tuple(tokens[last - n + 1:]))
            if end is not None:
                return tokens[end + 1: end + 1 + max_tokens]
        return []

    def _index(self, tokens: list[int], upto: int) -> None:
        start = self._indexed
        if upto <= start:
            return
        ends = self._ends
        for n in range(1, self.max_ngram + 1):
            first = max(start, n - 1)  # the first end position whose n-gram is new
            if first >= upto:
                continue
            grams = zip(*(tokens[first - n + 1 + i: upto - n + 1 + i] for i in range(n)), strict=True)
            ends.update(zip(grams, range(first, upto), strict=True))
        self._indexed = upto
