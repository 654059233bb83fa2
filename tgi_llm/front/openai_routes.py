"""OpenAI-compatible routes as TGI serves them: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from tgi_llm.front.chat import render_chat
from tgi_llm.front.completion_logprobs import completion_logprobs
from tgi_llm.front.errors import FrontError, validation
from tgi_llm.front.generation import Generation, openai_finish_reason
from tgi_llm.front.lora_routes import adapter_names
from tgi_llm.front.merge import merge_streams
from tgi_llm.front.protocol import Chunk, GenerateSpec, TokenInfo
from tgi_llm.front.reasoning import ReasoningSplitter
from tgi_llm.front.response_format import response_format_grammar
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
    FunctionCall,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    SamplingRequest,
    ToolCall,
    TopLogprob,
    Usage,
)
from tgi_llm.front.sse import DONE, SSEResponse, error_event, event, until_disconnect
from tgi_llm.front.state import FrontState
from tgi_llm.front.tgi_routes import peek
from tgi_llm.front.tools import ToolCallStream, ToolPlan, call_id, parse_answer, plan_tools, tool_prompt

#: Choices per request (OpenAI's `n`): each is its own generation; identical prompts share their KV blocks.
MAX_N = 8
#: Token ids a prompt may hold when the front has no tokenizer to know the vocabulary (the engine checks them).
MAX_TOKEN_ID = 2**31


def _choices(req: SamplingRequest) -> int:
    n = 1 if req.n is None else req.n
    if not 1 <= n <= MAX_N:
        raise validation(f"`n` must be >= 1 and <= {MAX_N}. Given: {n}")
    return n


def _best_of(req: CompletionRequest, n: int) -> int:
    """Candidates per prompt (OpenAI's completions `best_of`): at least `n`, of which the best `n` are returned."""
    best_of = n if req.best_of is None else req.best_of
    if not n <= best_of <= MAX_N:
        raise validation(f"`best_of` must be >= `n` ({n}) and <= {MAX_N}. Given: {best_of}")
    if req.stream and best_of != n:
        raise validation("`best_of` != `n` is not supported when streaming")
    return best_of


def _choice_params(params: dict, n: int, k: int) -> dict:
    """Choice k of n: sampled choices differ by seed (one seed given: seed, seed + 1, ...)."""
    if n > 1 and params.get("do_sample") and params.get("seed") is not None:
        return params | {"seed": params["seed"] + k}
    return params


def _usage(prompt: int, completion: int, cached: int = 0) -> Usage:
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


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

    def __init__(self, state: FrontState, prefix: str, adapter: str | None = None) -> None:
        self.fields = {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": adapter or state.config.model_id,
            "system_fingerprint": state.config.system_fingerprint,
        }


def build_router(state: FrontState) -> APIRouter:
    router = APIRouter()

    def chat_spec(req: ChatRequest) -> tuple[GenerateSpec, ToolPlan | None]:
        tools = plan_tools(req.tools, req.tool_choice)
        grammar = response_format_grammar(req.response_format)
        if tools is not None and grammar is not None:
            raise validation("`tools` and `response_format` cannot be used together")
        if req.top_logprobs is not None and not req.logprobs:
            raise validation("`top_logprobs` requires `logprobs` == true")
        tool_text = tool_prompt(tools, req.tool_prompt) if tools is not None else None
        prompt = render_chat(state.tokenizer, req.messages, req.tools if tools is not None else None, tool_text,
                             state.check_length, req.chat_template_kwargs)
        params = req.to_engine() | {"details": True}
        if (adapter := state.config.adapter_for(req.model)) is not None:
            params["adapter_id"] = adapter
        if tools is not None or grammar is not None:
            params["grammar"] = tools.grammar if tools is not None else grammar
        return state.spec(prompt, params, req.stream), tools

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = await state.parse(request, ChatRequest)
        n = _choices(req)
        spec, tools = await state.off_loop(chat_spec, req)  # grammars and the chat template: CPU work
        stamp = _Stamp(state, "chatcmpl", state.config.adapter_for(req.model))
        streams = [state.client.stream(GenerateSpec(spec.inputs, _choice_params(spec.parameters, n, k), spec.stream),
                                       state.new_request_id()) for k in range(n)]
        if req.stream:
            merged = merge_streams(streams)
            first = await peek(merged)
            return SSEResponse(chat_events(req, tools, stamp, first, merged, spec.inputs))
        gens = await until_disconnect(request, asyncio.gather(*(Generation.collect(s) for s in streams)))
        body = ChatCompletion(
            **stamp.fields, choices=[chat_choice(req, tools, k, g, spec.inputs) for k, g in enumerate(gens)],
            usage=_usage(gens[0].input_tokens, sum(g.generated_tokens for g in gens), gens[0].cached_tokens),
        ).model_dump()
        for choice in body["choices"]:  # only thinking models' answers carry the field
            if choice["message"]["reasoning_content"] is None:
                del choice["message"]["reasoning_content"]
        return JSONResponse(body)

    def chat_choice(req: ChatRequest, tools: ToolPlan | None, index: int, gen: Generation, prompt: str) -> ChatChoice:
        finish = openai_finish_reason(gen.finish_reason) or "length"
        reasoning, text = None, gen.text
        if state.splits_reasoning:
            reasoning, text = ReasoningSplitter.for_prompt(prompt).split(gen.text)
        message = ChatCompletionMessage(content=text, reasoning_content=reasoning)
        answer = parse_answer(text) if tools is not None else None
        if answer is not None and answer.is_call:
            call = ToolCall(id=call_id(), function=FunctionCall(name=answer.name, arguments=answer.arguments))
            message = ChatCompletionMessage(content=None, reasoning_content=reasoning, tool_calls=[call])
            finish = "tool_calls"
        elif answer is not None:
            message = ChatCompletionMessage(content=answer.content, reasoning_content=reasoning)
        return ChatChoice(index=index, message=message, finish_reason=finish,
                          logprobs=_logprobs(gen.tokens, gen.top_tokens) if req.logprobs else None)

    async def chat_events(
        req: ChatRequest, tools: ToolPlan | None, stamp: _Stamp, first: tuple[int, Chunk],
        rest: AsyncIterator[tuple[int, Chunk]], prompt: str,
    ) -> AsyncIterator[bytes]:
        def chunk_event(index: int, text: str | None, tokens: list[TokenInfo], tops: list[list[TokenInfo]],
                        finish: str | None, tool_calls: list | None = None, reasoning: str | None = None) -> bytes:
            choice = ChatChunkChoice(
                index=index,
                delta=ChatDelta(content=text, tool_calls=tool_calls, reasoning_content=reasoning),
                logprobs=_logprobs(tokens, tops) if req.logprobs and tokens else None,
                finish_reason=finish,
            )
            body = ChatCompletionChunk(**stamp.fields, choices=[choice]).model_dump()
            delta = body["choices"][0]["delta"]
            for key in ("content", "tool_calls", "reasoning_content"):  # only what the delta carries
                if delta[key] is None:
                    del delta[key]
            return event(body)

        calls: dict[int, ToolCallStream] = {}
        splitters: dict[int, ReasoningSplitter] = {}
        usage = [0, 0, 0]
        try:
            item: tuple[int, Chunk] | None = first
            while item is not None:
                k, chunk = item
                finish = openai_finish_reason(chunk.finish_reason or "length") if chunk.final else None
                if state.splits_reasoning:  # the <think> part as reasoning deltas, the rest as the answer's
                    splitter = splitters.setdefault(k, ReasoningSplitter.for_prompt(prompt))
                    reasoning, text = splitter.feed(chunk.text)
                    if chunk.final:
                        more_reasoning, more_text = splitter.finish()
                        reasoning, text = reasoning + more_reasoning, text + more_text
                    if reasoning:
                        yield chunk_event(k, None, [] if text else chunk.tokens, [] if text else chunk.top_tokens,
                                          None, reasoning=reasoning)
                        if not text:
                            chunk = replace(chunk, tokens=[], top_tokens=[])
                    chunk = replace(chunk, text=text)
                if tools is not None:  # a tool call: its pieces as they form, the call or the text at the end
                    stream = calls.setdefault(k, ToolCallStream())
                    for piece in stream.feed(chunk.text):
                        yield chunk_event(k, None, [], [], None, [piece])
                    if chunk.final:
                        pieces, answer = stream.finish()
                        for piece in pieces:
                            yield chunk_event(k, None, [], [], None, [piece])
                        if answer is not None and answer.is_call:
                            yield chunk_event(k, None, [], [], "tool_calls")
                        else:
                            yield chunk_event(k, answer.content if answer is not None else stream.text, [], [], finish)
                else:  # one event per token, as TGI streams (the reasoning splitter has cut the text already)
                    per_token = ([(chunk.text, chunk.tokens, chunk.top_tokens)] if state.splits_reasoning
                                 else chunk.per_token())
                    for i, (text, tokens, tops) in enumerate(per_token):
                        ends = finish if i == len(per_token) - 1 else None
                        if text or tokens or ends:
                            yield chunk_event(k, text, tokens, tops, ends)
                if chunk.final:
                    usage = [chunk.input_tokens or 0, usage[1] + (chunk.generated_tokens or 0),
                             chunk.cached_tokens or 0]
                item = await anext(rest, None)
            opts = req.stream_options
            if opts is not None and opts.include_usage:
                yield event(ChatCompletionChunk(**stamp.fields, choices=[], usage=_usage(*usage)).model_dump())
            yield DONE
        except FrontError as err:
            yield error_event(err, openai=True)
        finally:
            await rest.aclose()

    def completion_prompts(req: CompletionRequest) -> list[str | list[int]]:
        raw = req.prompt
        if isinstance(raw, str) or (raw and all(isinstance(t, int) for t in raw)):
            prompts = [raw]  # one text, or one prompt as token ids
        else:
            prompts = list(raw)
        if not prompts or any(len(p) == 0 for p in prompts):
            raise validation("`prompt` cannot be empty")
        limit = state.config.limits.max_client_batch_size
        if len(prompts) > limit:
            raise validation(f"Number of prompts exceeds the maximum allowed batch size of {limit}")
        vocab = len(state.tokenizer) if state.tokenizer is not None else MAX_TOKEN_ID
        for prompt in prompts:
            bad = next((t for t in prompt if not 0 <= t < vocab), None) if not isinstance(prompt, str) else None
            if bad is not None:  # refused here: ids past int64 cannot even be encoded for Triton
                raise validation(f"`prompt` token ids must be integers in [0, {vocab}). Given: {bad}")
        return prompts

    def echo_texts(prompts: list[str | list[int]], n: int) -> list[str]:
        """What `echo` puts before each choice's text: its prompt, token ids decoded."""
        if state.tokenizer is None and not all(isinstance(p, str) for p in prompts):
            raise FrontError("No fast tokenizer or tokenizer.json for this model", "no fast tokenizer")
        texts = [p if isinstance(p, str) else state.tokenizer.decode(p, skip_special_tokens=False) for p in prompts]
        return [t for t in texts for _ in range(n)]

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await state.parse(request, CompletionRequest)
        n = _choices(req)
        best_of = _best_of(req, n)
        prompts = completion_prompts(req)
        if req.suffix:
            raise validation("`suffix` is not supported")
        if req.logprobs is not None and not 0 <= req.logprobs <= state.config.limits.max_top_n_tokens:
            raise validation(f"`logprobs` must be >= 0 and <= {state.config.limits.max_top_n_tokens}. "
                             f"Given: {req.logprobs}")
        params = req.to_engine() | {"details": True}
        if (adapter := state.config.adapter_for(req.model)) is not None:
            params["adapter_id"] = adapter
        nothing_new = req.max_tokens == 0  # legal in OpenAI's API: one token is generated and dropped
        if nothing_new:
            params["max_new_tokens"] = 1
        if req.logprobs:
            params["top_n_tokens"] = req.logprobs
        if req.logprobs is not None and req.echo:
            if req.stream:
                raise validation("`echo` with `logprobs` is not supported when streaming")
            params["decoder_input_details"] = True
        texts = await state.off_loop(echo_texts, prompts, n) if req.echo else [""] * (len(prompts) * n)
        streams = [state.client.stream(state.spec(p, _choice_params(params, best_of, k), req.stream),
                                       state.new_request_id()) for p in prompts for k in range(best_of)]
        stamp = _Stamp(state, "cmpl", adapter)
        if req.stream:
            merged = merge_streams(streams)
            first = await peek(merged)
            return SSEResponse(completion_events(req, texts, stamp, first, merged))
        gens = await until_disconnect(request, asyncio.gather(*(Generation.collect(s) for s in streams)))
        kept: list[Generation] = []  # best_of: each prompt's n candidates of highest total logprob, best first
        for i in range(0, len(gens), best_of):
            group = gens[i:i + best_of]
            kept += sorted(group, key=Generation.total_logprob, reverse=True)[:n] if best_of > n else group
        choices = []
        for i, g in enumerate(kept):
            tokens, tops, text = (g.tokens, g.top_tokens, g.text) if not nothing_new else ([], [], "")
            logprobs = None
            if req.logprobs is not None:
                logprobs = completion_logprobs(g.prefill if req.echo else [], tokens, tops)
            choices.append(CompletionChoice(index=i, text=texts[i] + text, logprobs=logprobs,
                                            finish_reason="length" if nothing_new
                                            else openai_finish_reason(g.finish_reason)))
        # Every candidate's tokens count, as OpenAI bills best_of.
        body = Completion(**stamp.fields, choices=choices,
                          usage=_usage(sum(g.input_tokens for g in gens[::best_of]),
                                       0 if nothing_new else sum(g.generated_tokens for g in gens),
                                       sum(g.cached_tokens for g in gens[::best_of])))
        return JSONResponse(body.model_dump())

    async def completion_events(
        req: CompletionRequest, texts: list[str], stamp: _Stamp, first: tuple[int, Chunk],
        rest: AsyncIterator[tuple[int, Chunk]],
    ) -> AsyncIterator[bytes]:
        usage = [0, 0, 0]
        offsets = [len(t) if req.echo else 0 for t in texts]
        echoed: set[int] = set()
        try:
            item: tuple[int, Chunk] | None = first
            while item is not None:
                i, chunk = item
                finish = openai_finish_reason(chunk.finish_reason or "length") if chunk.final else None
                pieces = chunk.per_token()  # one event per token, as a step's several arrive together
                for k, (text, tokens, tops) in enumerate(pieces):
                    if req.echo and i not in echoed:
                        echoed.add(i)
                        text = texts[i] + text
                    logprobs = None
                    if req.logprobs is not None and tokens:
                        logprobs = completion_logprobs([], tokens, tops, offsets[i])
                        offsets[i] += sum(len(t.text) for t in tokens)
                    ends = finish if k == len(pieces) - 1 else None
                    if text or ends:
                        choice = CompletionChoice(index=i, text=text, logprobs=logprobs, finish_reason=ends)
                        yield event(Completion(**stamp.fields, choices=[choice]).model_dump(exclude={"usage"}))
                if chunk.final:
                    usage[0] += chunk.input_tokens or 0
                    usage[1] += chunk.generated_tokens or 0
                    usage[2] += chunk.cached_tokens or 0
                item = await anext(rest, None)
            opts = req.stream_options
            if opts is not None and opts.include_usage:
                yield event(Completion(**stamp.fields, choices=[], usage=_usage(*usage)).model_dump())
            yield DONE
        except FrontError as err:
            yield error_event(err, openai=True)
        finally:
            await rest.aclose()

    @router.get("/v1/models")
    async def models() -> Response:
        base = state.config.model_id
        cards = [ModelCard(id=base, owned_by=base, root=base)]
        cards += [ModelCard(id=name, owned_by=base, root=name, parent=base) for name in await adapter_names(state)]
        return JSONResponse(ModelList(data=cards).model_dump())

    return router

