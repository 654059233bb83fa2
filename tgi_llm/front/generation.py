"""Collects a request's Triton responses into one result: the non-streaming routes all end here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tgi_llm.front.errors import FrontError
from tgi_llm.front.protocol import Chunk, TokenInfo


@dataclass
class Generation:
    text: str = ""
    tokens: list[TokenInfo] = field(default_factory=list)
    top_tokens: list[list[TokenInfo]] = field(default_factory=list)
    prefill: list[TokenInfo] = field(default_factory=list)
    finish_reason: str | None = None
    input_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0
    accepted_draft_tokens: int = 0
    seed: int | None = None
    done: bool = False

    def add(self, chunk: Chunk) -> None:
        self.text += chunk.text
        self.tokens.extend(chunk.tokens)
        self.top_tokens.extend(chunk.top_tokens)
        if chunk.final:
            self.done = True
            self.finish_reason = chunk.finish_reason or "length"
            self.input_tokens = chunk.input_tokens or 0
            self.generated_tokens = (
                chunk.generated_tokens if chunk.generated_tokens is not None else len(self.tokens)
            )
            self.cached_tokens = chunk.cached_tokens or 0
            self.accepted_draft_tokens = chunk.accepted_draft_tokens or 0
            self.seed = chunk.seed
            self.prefill = list(chunk.prefill) or self.prefill

    def total_logprob(self) -> float:
        """What best_of ranks sequences by (TGI's choice)."""
        return sum(t.logprob or 0.0 for t in self.tokens)

    @classmethod
    async def collect(cls, chunks: AsyncIterator[Chunk]) -> Generation:
        gen = cls()
        async for chunk in chunks:
            gen.add(chunk)
            if gen.done:
                break
        if not gen.done:
            raise FrontError("Incomplete generation", "incomplete_generation")
        return gen


#: TGI's mapping of its finish reasons onto OpenAI's.
OPENAI_FINISH_REASON = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}


def openai_finish_reason(reason: str | None) -> str | None:
    return None if reason is None else OPENAI_FINISH_REASON.get(reason, reason)
