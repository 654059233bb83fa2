"""OpenAI-compatible routes as TGI serves them: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from tgi_llm.front.chat import render_chat
from tgi_llm.front.errors import FrontError, validation
from tgi_llm.front.generation import Generation, openai_finish_reason
from tgi_llm.front.merge import merge_streams
from tgi_llm.front.protocol import Chunk, GenerateSpec, TokenInfo
from tgi_llm.front.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatDelta,
    ChatLogprob,
    ChatLogprobs,
    ChatRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    SamplingRequest,
    TopLogprob,
    Usage,
)
from tgi_llm.front.sse import DONE, SSEResponse, error_event, event, until_disconnect
from tgi_llm.front.state import FrontState, parse_body
from tgi_llm.front.tgi_routes import peek


def _check_common(req: SamplingRequest) -> None:
    if req.n not in (None, 1):
        raise validation(f"`n` must be 1. Given: {req.n}")


def _usage(prompt: int, completion: int) -> Usage:
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _logprobs(tokens: list[TokenInfo], tops: list[list[TokenInfo]]) -> ChatLogprobs:
    content = []
    for i, tok in enumerate(tokens):
        top = tops[i] if i < len(tops) else []
        content.append(
            ChatLogprob(
                token=tok.text,
                logprob=tok.logprob if tok.logprob is not None else 0.0,
                top_logprobs=[TopLogprob(token=t.text, logprob=t.logprob or 0.0) for t in top],
            )
        )
    return ChatLogprobs(content=content)


class _Stamp:
    """id, created, model and system_fingerprint: the same on every chunk of one response."""

    def __init__(self, state: FrontState, prefix: str) -> None:
        self.fields = {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": state.config.model_id,
            "system_fingerprint": state.config.system_fingerprint,
        }


def build_router(state: FrontState) -> APIRouter:
    router = APIRouter()

    def chat_spec(req: ChatRequest) -> GenerateSpec:
        _check_common(req)
        if req.tools and req.tool_choice != "none":
            raise validation("Tool calls are not supported")
        if req.response_format is not None and req.response_format != {"type": "text"}:
            raise validation("grammar is not supported")
        if req.top_logprobs is not None and not req.logprobs:
            raise validation("`top_logprobs` requires `logprobs` == true")
        prompt = render_chat(state.tokenizer, req.messages)
        return state.spec(prompt, req.to_engine() | {"details": True}, req.stream)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = await parse_body(request, ChatRequest)
        spec = chat_spec(req)
        stamp = _Stamp(state, "chatcmpl")
        chunks = state.client.stream(spec, state.new_request_id())
        if req.stream:
            first = await peek(chunks)
            return SSEResponse(chat_events(req, stamp, first, chunks))
        gen = await until_disconnect(request, Generation.collect(chunks))
        body = ChatCompletion(
            **stamp.fields,
            choices=[
                ChatChoice(
                    message=ChatCompletionMessage(content=gen.text),
                    logprobs=_logprobs(gen.tokens, gen.top_tokens) if req.logprobs else None,
                    finish_reason=openai_finish_reason(gen.finish_reason) or "length",
                )
            ],
            usage=_usage(gen.input_tokens, gen.generated_tokens),
        )
        return JSONResponse(body.model_dump())

    async def chat_events(
        req: ChatRequest, stamp: _Stamp, first: Chunk, rest: AsyncIterator[Chunk]
    ) -> AsyncIterator[bytes]:
        def chunk_event(text: str, tokens: list[TokenInfo], tops: list[list[TokenInfo]], finish: str | None) -> bytes:
            choice = ChatChunkChoice(
                delta=ChatDelta(content=text),
                logprobs=_logprobs(tokens, tops) if req.logprobs and tokens else None,
                finish_reason=finish,
            )
            return event(ChatCompletionChunk(**stamp.fields, choices=[choice]).model_dump())

        try:
            chunk: Chunk | None = first
            while chunk is not None:
                finish = openai_finish_reason(chunk.finish_reason or "length") if chunk.final else None
                if len(chunk.tokens) > 1:  # one event per token, as TGI streams
                    for i, tok in enumerate(chunk.tokens):
                        last = i == len(chunk.tokens) - 1
                        tops = chunk.top_tokens[i : i + 1]
                        yield chunk_event(tok.text, [tok], tops, finish if last else None)
                elif chunk.text or chunk.tokens or chunk.final:
                    yield chunk_event(chunk.text, chunk.tokens, chunk.top_tokens, finish)
                if chunk.final:
                    opts = req.stream_options
                    if opts is not None and opts.include_usage:
                        usage = _usage(chunk.input_tokens or 0, chunk.generated_tokens or 0)
                        yield event(ChatCompletionChunk(**stamp.fields, choices=[], usage=usage).model_dump())
                    yield DONE
                    return
                chunk = await anext(rest, None)
            yield error_event(FrontError("Incomplete generation", "incomplete_generation"))
        except FrontError as err:
            yield error_event(err)
        finally:
            await rest.aclose()

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await parse_body(request, CompletionRequest)
        _check_common(req)
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        limit = state.config.limits.max_client_batch_size
        if not prompts:
            raise validation("`prompt` cannot be empty")
        if len(prompts) > limit:
            raise validation(f"Number of prompts exceeds the maximum allowed batch size of {limit}")
        if req.suffix:
            raise validation("`suffix` is not supported")
        params = req.to_engine() | {"details": True}
        specs = [state.spec(p, params, req.stream) for p in prompts]
        streams = [state.client.stream(spec, state.new_request_id()) for spec in specs]
        stamp = _Stamp(state, "cmpl")
        if req.stream:
            merged = merge_streams(streams)
            first = await peek(merged)
            return SSEResponse(completion_events(req, prompts, stamp, first, merged))
        gens = await until_disconnect(request, asyncio.gather(*(Generation.collect(s) for s in streams)))
        body = Completion(
            **stamp.fields,
            choices=[
                CompletionChoice(
                    index=i,
                    text=(prompts[i] if req.echo else "") + g.text,
                    finish_reason=openai_finish_reason(g.finish_reason),
                )
                for i, g in enumerate(gens)
            ],
            usage=_usage(sum(g.input_tokens for g in gens), sum(g.generated_tokens for g in gens)),
        )
        return JSONResponse(body.model_dump())

    async def completion_events(
        req: CompletionRequest, prompts: list[str], stamp: _Stamp, first: tuple[int, Chunk],
        rest: AsyncIterator[tuple[int, Chunk]],
    ) -> AsyncIterator[bytes]:
        usage = [0, 0]
        echoed: set[int] = set()
        try:
            item: tuple[int, Chunk] | None = first
            while item is not None:
                i, chunk = item
                text = chunk.text
                if req.echo and i not in echoed:
                    echoed.add(i)
                    text = prompts[i] + text
                finish = openai_finish_reason(chunk.finish_reason or "length") if chunk.final else None
                if text or finish:
                    choice = CompletionChoice(index=i, text=text, finish_reason=finish)
                    yield event(Completion(**stamp.fields, choices=[choice]).model_dump(exclude={"usage"}))
                if chunk.final:
                    usage[0] += chunk.input_tokens or 0
                    usage[1] += chunk.generated_tokens or 0
                item = await anext(rest, None)
            opts = req.stream_options
            if opts is not None and opts.include_usage:
                yield event(Completion(**stamp.fields, choices=[], usage=_usage(*usage)).model_dump())
            yield DONE
        except FrontError as err:
            yield error_event(err)
        finally:
            await rest.aclose()

    @router.get("/v1/models")
    async def models() -> Response:
        card = ModelCard(id=state.config.model_id, owned_by=state.config.model_id)
        return JSONResponse(ModelList(data=[card]).model_dump())

    return router

