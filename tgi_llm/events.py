"""What the engine emits for a request: token events, then exactly one final or error event."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from tgi_llm.errors import TgiError


class FinishReason(str, Enum):
    LENGTH = "length"
    EOS_TOKEN = "eos_token"
    STOP_SEQUENCE = "stop_sequence"


@dataclass(frozen=True)
class Token:
    id: int
    text: str
    logprob: float
    special: bool = False


@dataclass(frozen=True)
class PrefillToken:
    id: int
    text: str
    logprob: float | None  # the first prompt token has no logprob, as in TGI
    top: list[Token] = field(default_factory=list)  # the best alternatives there (top_n_tokens), best first


@dataclass(frozen=True)
class TokenEvent:
    """One generated token. `token.text` is the text delta: deltas concatenate to the output."""

    request_id: int
    index: int  # 0-based position among generated tokens
    token: Token
    top_tokens: list[Token] = field(default_factory=list)
    #: The request's FinalEvent follows at once: a streaming front end can send both as one response.
    last: bool = False


@dataclass(frozen=True)
class FinalEvent:
    """The request finished normally. Sent after its last TokenEvent."""

    request_id: int
    generated_text: str
    finish_reason: FinishReason
    generated_tokens: int
    input_tokens: int
    seed: int | None
    token_ids: list[int]
    tokens: list[Token] = field(default_factory=list)
    top_tokens: list[list[Token]] = field(default_factory=list)
    prefill: list[PrefillToken] = field(default_factory=list)
    #: Prompt tokens whose K/V came from the prefix cache (not computed for this request).
    cached_tokens: int = 0
    #: Draft tokens speculation guessed for this request, and how many of them were accepted.
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    queue_time_s: float = 0.0
    inference_time_s: float = 0.0


@dataclass(frozen=True)
class ErrorEvent:
    """The request ended with an error (generation failure, cancellation, shutdown)."""

    request_id: int
    error: TgiError


Event = TokenEvent | FinalEvent | ErrorEvent
