"""Thinking models' `<think>…</think>` part, returned apart as OpenAI's `reasoning_content`.

Qwen3, SmolLM3 and DeepSeek-R1's distills write their reasoning between `<think>` and `</think>` before the
answer; vLLM's and llama.cpp's reasoning parsers return it as `reasoning_content` (streamed as
`delta.reasoning_content`), which is what chat clients show apart. Splitting happens only for a tokenizer
that has both tags as tokens (`--reasoning-format auto`, the default); `none` keeps them inline. The
output is reasoning from its start when it opens with `<think>` or when the prompt itself ends with one
(templates that open the thought for the model); without either, all of it is the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<think>", "</think>"
REASONING_FORMATS = ("auto", "none")


def has_reasoning_tags(tokenizer: Any) -> bool:
    """Whether the vocabulary holds `<think>` and `</think>` as tokens of their own."""
    vocab = tokenizer.get_vocab() if tokenizer is not None else {}
    return OPEN in vocab and CLOSE in vocab


def _held_back(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag` (kept until the next piece)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


@dataclass
class ReasoningSplitter:
    """Splits one choice's generated text, piece by piece as it streams, into reasoning and answer."""

    thinking: bool = False  # inside <think>
    decided: bool = False  # whether the start of the output was seen (a leading <think> or not)
    trim: bool = False  # drop the newlines that follow </think>
    trim_open: bool = True  # drop the newlines that follow <think>
    closed: bool = False  # a thought was closed
    pending: str = ""

    @classmethod
    def for_prompt(cls, prompt: str) -> ReasoningSplitter:
        opened = prompt.rstrip().endswith(OPEN)
        return cls(thinking=opened, decided=opened)

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, answer): what this piece adds to each, as far as it can be told yet."""
        text, self.pending = self.pending + text, ""
        reasoning = ""
        if not self.decided:
            stripped = text.lstrip()
            if stripped.startswith(OPEN):
                self.decided, self.thinking, text = True, True, stripped[len(OPEN):]
            elif OPEN.startswith(stripped):  # maybe the opening tag, still arriving
                self.pending = text
                return "", ""
            else:
                self.decided = True  # no leading tag: all of it is the answer
        if self.thinking:
            if self.trim_open:
                text = text.lstrip("\n")
                self.trim_open = not text
            end = text.find(CLOSE)
            if end < 0:
                keep = _held_back(text, CLOSE)
                self.pending = text[len(text) - keep:] if keep else ""
                return text[: len(text) - keep], ""
            reasoning, text = text[:end], text[end + len(CLOSE):]
            self.thinking, self.trim, self.closed = False, True, True
        if self.trim:
            text = text.lstrip("\n")
            self.trim = not text
        return reasoning, text

    def finish(self) -> tuple[str, str]:
        """What was held back, at the end of the output: reasoning when it never closed its thought."""
        rest, self.pending = self.pending, ""
        return (rest, "") if self.thinking else ("", rest)

    @property
    def thought(self) -> bool:
        """Whether the output has a reasoning part (an open or closed thought)."""
        return self.thinking or self.closed

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning, or None where the output has none; answer) of a whole generated text."""
        reasoning, answer = self.feed(text)
        more_reasoning, more_answer = self.finish()
        return (reasoning + more_reasoning if self.thought else None), answer + more_answer
