"""The narrow interface between the HTTP routes and Triton: one request in, decoded responses out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class TokenInfo:
    id: int
    text: str
    logprob: float | None
    special: bool = False
    top: list[TokenInfo] = field(default_factory=list)  # prompt tokens: the best alternatives there


@dataclass(frozen=True)
class GenerateSpec:
    """What the front asks Triton for: the prompt and TGI parameters (names as TGI's GenerateParameters)."""

    inputs: str | list[int]  # text, or token ids (sent as the model's input_ids)
    parameters: dict[str, Any] = field(default_factory=dict)
    stream: bool = False


@dataclass(frozen=True)
class Chunk:
    """One decoded Triton response. Token fields are empty when the model sent none with this response."""

    text: str = ""  # the text delta this response adds (the whole text on a non-streaming final)
    tokens: list[TokenInfo] = field(default_factory=list)
    top_tokens: list[list[TokenInfo]] = field(default_factory=list)
    final: bool = False
    generated_tokens: int | None = None  # tokens generated so far (on every streamed response and the final)
    # Only on the final response:
    finish_reason: str | None = None  # TGI's: length, eos_token, stop_sequence
    input_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache
    accepted_draft_tokens: int | None = None  # generated tokens speculation guessed right
    seed: int | None = None
    prefill: list[TokenInfo] = field(default_factory=list)

    def per_token(self) -> list[tuple[str, list[TokenInfo], list[list[TokenInfo]]]]:
        """(text, tokens, top tokens) for each event a stream sends: a step's several tokens one by one, a
        response with one token or none as it is."""
        if len(self.tokens) <= 1:
            return [(self.text, self.tokens, self.top_tokens)]
        return [(t.text, [t], self.top_tokens[k:k + 1]) for k, t in enumerate(self.tokens)]


class TritonGenerateClient(Protocol):
    """Leaving `stream` early (aclose, task cancelled) cancels the Triton request: its KV blocks come back."""

    def stream(self, spec: GenerateSpec, request_id: str) -> AsyncIterator[Chunk]: ...

    async def ready(self) -> bool: ...

    async def metrics(self) -> str: ...

    async def close(self) -> None: ...
