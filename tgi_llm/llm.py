"""The small public Python API: `LLM(model_id).generate(prompts, params)` and streaming."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from tgi_llm.engine import Engine, EngineOptions, LimitOptions, RequestHandle, build_engine
from tgi_llm.errors import TgiError
from tgi_llm.events import ErrorEvent, Event, FinalEvent, TokenEvent

Prompt = str | Sequence[int]


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]
    text: str
    finish_reason: str
    generated_tokens: int
    final: FinalEvent  # everything else: details, timings, prefill tokens


class LLM:
    """One engine with its loop running. Keyword arguments are EngineOptions or LimitOptions fields."""

    def __init__(self, model_id: str | None = None, *, engine: Engine | None = None, **kwargs: Any) -> None:
        if engine is None:
            limit_names = {f.name for f in fields(LimitOptions)}
            limits = LimitOptions(**{k: v for k, v in kwargs.items() if k in limit_names})
            rest = {k: v for k, v in kwargs.items() if k not in limit_names}
            engine = build_engine(EngineOptions(model_id=model_id, limits=limits, **rest))
        self.engine = engine
        self.engine.start()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def submit(self, prompt: Prompt, params: Mapping[str, Any] | None,
               on_event: Callable[[Event], None], stream: bool = False) -> RequestHandle:
        """Validate and queue one request; raises ValidationError / OverloadedError at once."""
        return self.engine.submit(self.engine.validate(prompt, params, stream=stream), on_event)

    def generate(self, prompts: Sequence[Prompt],
                 params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None) -> list[GenerationResult]:
        """Run every prompt concurrently (one batch as far as the limits allow); results in order."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings or of token-id lists")
        per_prompt = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(per_prompt)} parameter sets")
        requests = [self.engine.validate(p, q) for p, q in zip(prompts, per_prompt, strict=True)]
        done: queue.SimpleQueue[tuple[int, Event]] = queue.SimpleQueue()
        for i, req in enumerate(requests):
            self.engine.submit(req, lambda e, i=i: done.put((i, e)) if not isinstance(e, TokenEvent) else None)
        finals: dict[int, FinalEvent] = {}
        while len(finals) < len(requests):
            i, event = done.get()
            if isinstance(event, ErrorEvent):
                raise event.error
            finals[i] = event
        return [_result(finals[i]) for i in range(len(requests))]

    def stream(self, prompt: Prompt, params: Mapping[str, Any] | None = None) -> Iterator[TokenEvent | FinalEvent]:
        """Yield TokenEvents then the FinalEvent; leaving the loop early cancels the request."""
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        handle = self.submit(prompt, params, events.put, stream=True)
        finished = False
        try:
            while True:
                event = events.get()
                if isinstance(event, ErrorEvent):
                    finished = True
                    raise event.error
                yield event
                if isinstance(event, FinalEvent):
                    finished = True
                    return
        finally:
            if not finished:
                handle.cancel()

    def close(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _result(final: FinalEvent) -> GenerationResult:
    return GenerationResult(final.token_ids, final.generated_text, final.finish_reason.value,
                            final.generated_tokens, final)


__all__ = ["LLM", "GenerationResult", "TgiError"]
