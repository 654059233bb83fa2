"""The TritonGenerateClient interface over an in-process `tgi_llm.LLM`: the real model, tokenizer and
engine behind the front without tritonserver (the Triton path is tested in tests/front/test_triton_*)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tgi_llm import LLM
from tgi_llm.errors import TgiError
from tgi_llm.events import ErrorEvent, FinalEvent, TokenEvent
from tgi_llm.front.errors import FrontError
from tgi_llm.front.protocol import Chunk, GenerateSpec, TokenInfo


def _info(token) -> TokenInfo:
    return TokenInfo(token.id, token.text, token.logprob, getattr(token, "special", False))


@dataclass
class EngineClient:
    llm: LLM
    ended: list[str] = field(default_factory=list)  # how each request ended: a finish reason or error type

    def _record(self, event) -> None:  # engine thread
        if isinstance(event, FinalEvent):
            self.ended.append(event.finish_reason.value)
        elif isinstance(event, ErrorEvent):
            self.ended.append(event.error.error_type)

    async def stream(self, spec: GenerateSpec, request_id: str) -> AsyncIterator[Chunk]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        try:
            handle = self.llm.submit(spec.inputs, spec.parameters,
                                     lambda e: (self._record(e), loop.call_soon_threadsafe(events.put_nowait, e)),
                                     stream=spec.stream)
        except TgiError as exc:
            raise FrontError(str(exc), exc.error_type) from None
        done = False
        try:
            while True:
                event = await events.get()
                if isinstance(event, ErrorEvent):
                    done = True
                    raise FrontError(str(event.error), event.error.error_type)
                if isinstance(event, TokenEvent):
                    yield Chunk(text=event.token.text, tokens=[_info(event.token)],
                                top_tokens=[[_info(t) for t in event.top_tokens]] if event.top_tokens else [])
                    continue
                assert isinstance(event, FinalEvent)
                done = True
                yield Chunk(final=True, finish_reason=event.finish_reason.value, input_tokens=event.input_tokens,
                            generated_tokens=event.generated_tokens, seed=event.seed,
                            prefill=[TokenInfo(t.id, t.text, t.logprob) for t in event.prefill])
                return
        finally:
            if not done:
                handle.cancel()

    async def ready(self) -> bool:
        return True

    async def metrics(self) -> str:
        return ""

    async def close(self) -> None:
        pass
