"""A scripted stand-in for the Triton client: deterministic tokens, TGI's errors, and a record of what was
asked and what was cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tgi_llm.front.errors import FrontError
from tgi_llm.front.protocol import Chunk, GenerateSpec, TokenInfo

DEFAULT_MAX_NEW_TOKENS = 5


def word(i: int) -> str:
    return f" w{i}"


@dataclass
class FakeTritonClient:
    """Generates " w0 w1 ..." (ids 100, 101, ...), one response per token, the final on the last token.

    Prompts steer it: "overload" -> overloaded, "crash" -> RuntimeError (a bug), "boom" -> generation error
    after two tokens, "eos" -> stops with eos_token after three tokens, "slow" anywhere -> waits on `release`
    before each token after the first.
    A non-positive temperature is rejected with the engine's message.
    """

    healthy: bool = True
    specs: list[GenerateSpec] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    release: asyncio.Event | None = None
    closed: bool = False
    final_alone: bool = False  # send the end (reason, counts) in a token-less response after the last token
    script: list[str] | None = None  # the token texts to generate instead of " w0 w1 ..."

    async def stream(self, spec: GenerateSpec, request_id: str) -> AsyncIterator[Chunk]:
        self.specs.append(spec)
        params = spec.parameters
        try:
            temperature = params.get("temperature")
            if temperature is not None and temperature <= 0:
                raise FrontError("`temperature` must be strictly positive", "validation")
            if spec.inputs == "overload":
                raise FrontError("Model is overloaded", "overloaded")
            if spec.inputs == "crash":  # a bug: what no handler expects
                raise RuntimeError("unexpected\nsecond line")
            n = params.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS
            if self.script is not None:
                n = min(n, len(self.script))
            reason = "length"
            if spec.inputs == "eos":
                n, reason = 3, "eos_token"
            stops = params.get("stop") or []
            text = ""
            for i in range(n):
                if spec.inputs == "boom" and i == 2:
                    raise FrontError("Request failed during generation: boom", "generation")
                if "slow" in spec.inputs and i > 0:
                    if self.release is None:  # made here: an asyncio.Event belongs to the server's loop
                        self.release = asyncio.Event()
                    await self.release.wait()
                piece = self.script[i] if self.script is not None else word(i)
                text += piece
                hit_stop = any(s in text for s in stops)
                last = i == n - 1 or hit_stop
                top = [TokenInfo(100 + i, piece, -0.1), TokenInfo(7, " x", -2.5)]
                tops = [top] if params.get("top_n_tokens") else []
                special = spec.inputs == "eos" and last  # the EOS token: special, as TGI marks it
                token = Chunk(text=piece, tokens=[TokenInfo(100 + i, piece, -0.1 * (i + 1), special)], top_tokens=tops)
                if self.final_alone and last:
                    yield token
                    token = Chunk()
                yield Chunk(
                    text=token.text,
                    tokens=token.tokens,
                    top_tokens=token.top_tokens,
                    final=last,
                    finish_reason=("stop_sequence" if hit_stop else reason) if last else None,
                    input_tokens=(len(spec.inputs.split()) if isinstance(spec.inputs, str) else len(spec.inputs))
                    if last else None,
                    generated_tokens=i + 1 if last else None,
                    seed=params.get("seed") if last and params.get("do_sample") else None,
                    prefill=[TokenInfo(1, "<s>", None), TokenInfo(2, "hi", -1.5)] if last else [],
                )
                await asyncio.sleep(0)
                if last:
                    self.finished.append(request_id)
                    return
        except (GeneratorExit, asyncio.CancelledError):  # the caller closed the stream early
            self.cancelled.append(request_id)
            raise

    async def ready(self) -> bool:
        return self.healthy

    async def metrics(self) -> str:
        return "# TYPE tgi_request_count counter\ntgi_request_count 3\n"

    async def close(self) -> None:
        self.closed = True
