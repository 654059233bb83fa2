"""When a request stops: max_new_tokens, EOS, stop sequences (TGI's StoppingCriteria)."""

from __future__ import annotations

from collections.abc import Iterable

from tgi_llm.events import FinishReason
from tgi_llm.request import StoppingParams


class StopChecker:
    """Per request; call `check` once per generated token, in order.

    Checks in TGI's order: the token that reaches max_new_tokens reports `length` even if
    it is EOS or completes a stop sequence; then EOS (unless ignore_eos); then stop
    sequences. Stop sequences are matched on the decoded text, across token boundaries;
    the stop sequence stays in the generated text, as in TGI.
    """

    def __init__(self, eos_token_ids: Iterable[int], stopping: StoppingParams):
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stopping = stopping
        self.generated_tokens = 0
        self._stops = tuple(s for s in stopping.stop_sequences if s)
        # Only the last (longest stop - 1) characters can start a match that new text completes.
        self._keep = max((len(s) for s in self._stops), default=1) - 1
        self._tail = ""

    def check(self, token_id: int, new_text: str, grammar_done: bool = False) -> FinishReason | None:
        """`new_text` is the text this token added (the detokenizer's delta, possibly ""); `grammar_done`:
        the token is the end-of-sequence that completes the request's grammar (ends it even with ignore_eos)."""
        self.generated_tokens += 1
        if self.generated_tokens >= self.stopping.max_new_tokens:
            return FinishReason.LENGTH
        if grammar_done:
            return FinishReason.EOS_TOKEN
        if self.generated_tokens <= self.stopping.min_new_tokens:
            if self._stops and new_text:  # still track the text, so a stop sequence can span the minimum
                self._tail = (self._tail + new_text)[-self._keep:] if self._keep else ""
            return None
        if not self.stopping.ignore_eos and token_id in self.eos_token_ids:
            return FinishReason.EOS_TOKEN
        if self._stops and new_text:
            # Search only where a match would involve new text. TGI only looks for a stop sequence
            # at the very end of the text, so it misses one followed by more text in the same delta.
            window = self._tail + new_text
            for stop in self._stops:
                if stop in window[max(len(self._tail) - len(stop) + 1, 0) :]:
                    return FinishReason.STOP_SEQUENCE
            self._tail = window[max(len(window) - self._keep, 0) :] if self._keep else ""
        return None
