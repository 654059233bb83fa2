"""TGI's own routes: /generate, /generate_stream, POST / (compat), /tokenize."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from tgi_llm.front.errors import FrontError
from tgi_llm.front.generation import Generation
from tgi_llm.front.protocol import Chunk, GenerateSpec, TokenInfo
from tgi_llm.front.schemas import (
    BestOfSequence,
    CompatGenerateRequest,
    Details,
    GenerateRequest,
    GenerateResponse,
    PrefillToken,
    Token,
)
from tgi_llm.front.sse import SSEResponse, until_disconnect
from tgi_llm.front.state import FrontState
from tgi_llm.front.tgi_stream import tgi_events
from tgi_llm.front.tokenizer import tokenize


def _best_of(state: FrontState, req: GenerateRequest, stream: bool) -> int:
    """How many sequences to draw (TGI's best_of, with its rules and messages)."""
    p = req.parameters
    n = p.best_of or 1
    limit = state.config.limits.max_best_of
    if not 1 <= n <= limit:
        raise FrontError(f"`best_of` must be > 0 and <= {limit}. Given: {n}", "validation")
    if n > 1:
        sampling = p.do_sample or (p.temperature is not None and p.temperature != 1.0) or bool(p.top_k) or (
            p.top_p is not None and p.top_p < 1.0) or (p.typical_p is not None and p.typical_p < 1.0)
        if not sampling:
            raise FrontError("you must use sampling when `best_of` is > 1", "validation")
        if p.seed is not None:
            raise FrontError("`seed` must not be set when `best_of` > 1", "validation")
        if stream:
            raise FrontError("`best_of` != 1 is not supported when streaming tokens", "validation")
    return n


def _spec(state: FrontState, req: GenerateRequest, stream: bool) -> GenerateSpec:
    params = req.parameters.to_engine()
    params.pop("best_of", None)  # the front draws the sequences; the model makes one each
    # The front adds the prompt itself (as TGI's router does), so Triton always returns only new text;
    # and it always asks for per-token details: stream events and details need token ids.
    params.pop("return_full_text", None)
    params["details"] = True
    return state.spec(req.inputs, params, stream)


def _token(t: TokenInfo) -> Token:
    return Token(id=t.id, text=t.text, logprob=t.logprob, special=t.special)


def _prefill(gen: Generation) -> list[PrefillToken]:
    return [PrefillToken(id=t.id, text=t.text, logprob=t.logprob) for t in gen.prefill]


def generate_response(req: GenerateRequest, gen: Generation, others: list[Generation] = ()) -> GenerateResponse:
    """`others`: with best_of, the sequences that lost to `gen` (TGI's details.best_of_sequences)."""
    p = req.parameters
    prefix = req.inputs if p.return_full_text else ""
    text = prefix + gen.text
    details = None
    if p.details or p.decoder_input_details:
        best_of = [BestOfSequence(
            generated_text=prefix + g.text, finish_reason=g.finish_reason or "length",
            generated_tokens=g.generated_tokens, seed=g.seed,
            prefill=_prefill(g) if p.decoder_input_details else [], tokens=[_token(t) for t in g.tokens],
            top_tokens=[[_token(t) for t in top] for top in g.top_tokens] if p.top_n_tokens else [],
        ) for g in others]
        details = Details(
            best_of_sequences=best_of or None,
            finish_reason=gen.finish_reason or "length",
            generated_tokens=gen.generated_tokens,
            seed=gen.seed,
            cached_tokens=gen.cached_tokens,
            accepted_draft_tokens=gen.accepted_draft_tokens,
            prefill=_prefill(gen) if p.decoder_input_details else [],
            tokens=[_token(t) for t in gen.tokens],
            top_tokens=[[_token(t) for t in top] for top in gen.top_tokens] if p.top_n_tokens else None,
        )
    return GenerateResponse(generated_text=text, details=details)


async def peek(chunks: AsyncIterator[Chunk]) -> Chunk:
    """The first response, before the HTTP status is sent: a rejected request gets TGI's status code, not
    a 200 stream holding an error."""
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        raise FrontError("Incomplete generation", "incomplete_generation") from None
    except BaseException:
        await chunks.aclose()
        raise


def _tokenize(state: FrontState, text: str) -> Response:
    """/tokenize's answer, JSON encoding included (a worker's job: ~40k tokens under the length bound)."""
    return JSONResponse([t.model_dump() for t in tokenize(state.tokenizer, text)])


def build_router(state: FrontState) -> APIRouter:
    router = APIRouter()

    async def generate(request: Request, req: GenerateRequest) -> tuple[GenerateResponse, dict[str, str]]:
        start = time.monotonic()
        n = _best_of(state, req, stream=False)
        spec = _spec(state, req, stream=False)
        streams = [state.client.stream(spec, state.new_request_id()) for _ in range(n)]
        gens = await until_disconnect(request, asyncio.gather(*(Generation.collect(s) for s in streams)))
        # TGI's choice: the sequence with the highest total logprob (each drew with its own random seed).
        ranked = sorted(gens, key=Generation.total_logprob, reverse=True)
        gen = ranked[0]
        headers = {
            "x-compute-type": "tgi-llm",
            "x-total-time": str(int((time.monotonic() - start) * 1000)),
            "x-prompt-tokens": str(gen.input_tokens),
            "x-generated-tokens": str(gen.generated_tokens),
        }
        return generate_response(req, gen, ranked[1:]), headers

    async def generate_stream(req: GenerateRequest) -> Response:
        _best_of(state, req, stream=True)
        chunks = state.client.stream(_spec(state, req, stream=True), state.new_request_id())
        first = await peek(chunks)
        return SSEResponse(tgi_events(req.parameters, req.inputs, first, chunks))

    @router.post("/generate")
    async def generate_route(request: Request) -> Response:
        resp, headers = await generate(request, await state.parse(request, GenerateRequest))
        return JSONResponse(resp.to_json(), headers=headers)

    @router.post("/generate_stream")
    async def generate_stream_route(request: Request) -> Response:
        return await generate_stream(await state.parse(request, GenerateRequest))

    @router.post("/")
    async def compat_generate(request: Request) -> Response:
        req = await state.parse(request, CompatGenerateRequest)
        if req.stream:
            return await generate_stream(req)
        resp, headers = await generate(request, req)
        return JSONResponse([resp.to_json()], headers=headers)

    @router.post("/tokenize")
    async def tokenize_route(request: Request) -> Response:
        req = await state.parse(request, GenerateRequest)
        state.check_length("inputs", len(req.inputs))
        return await state.off_loop(_tokenize, state, req.inputs)

    return router
