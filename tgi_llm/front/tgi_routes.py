"""TGI's own routes: /generate, /generate_stream, POST / (compat), /tokenize."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from tgi_llm.front.errors import FrontError
from tgi_llm.front.generation import Generation
from tgi_llm.front.protocol import Chunk, GenerateSpec, TokenInfo
from tgi_llm.front.schemas import (
    CompatGenerateRequest,
    Details,
    GenerateRequest,
    GenerateResponse,
    PrefillToken,
    Token,
)
from tgi_llm.front.sse import SSEResponse, until_disconnect
from tgi_llm.front.state import FrontState, parse_body
from tgi_llm.front.tgi_stream import tgi_events
from tgi_llm.front.tokenizer import tokenize


def _spec(state: FrontState, req: GenerateRequest, stream: bool) -> GenerateSpec:
    params = req.parameters.to_engine()
    # The front adds the prompt itself (as TGI's router does), so Triton always returns only new text;
    # and it always asks for per-token details: stream events and details need token ids.
    params.pop("return_full_text", None)
    params["details"] = True
    return state.spec(req.inputs, params, stream)


def _token(t: TokenInfo) -> Token:
    return Token(id=t.id, text=t.text, logprob=t.logprob, special=t.special)


def generate_response(req: GenerateRequest, gen: Generation) -> GenerateResponse:
    p = req.parameters
    text = (req.inputs if p.return_full_text else "") + gen.text
    details = None
    if p.details or p.decoder_input_details:
        details = Details(
            finish_reason=gen.finish_reason or "length",
            generated_tokens=gen.generated_tokens,
            seed=gen.seed,
            cached_tokens=gen.cached_tokens,
            prefill=[PrefillToken(id=t.id, text=t.text, logprob=t.logprob) for t in gen.prefill]
            if p.decoder_input_details
            else [],
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


def build_router(state: FrontState) -> APIRouter:
    router = APIRouter()

    async def generate(request: Request, req: GenerateRequest) -> tuple[GenerateResponse, dict[str, str]]:
        start = time.monotonic()
        chunks = state.client.stream(_spec(state, req, stream=False), state.new_request_id())
        gen = await until_disconnect(request, Generation.collect(chunks))
        headers = {
            "x-compute-type": "tgi-llm",
            "x-total-time": str(int((time.monotonic() - start) * 1000)),
            "x-prompt-tokens": str(gen.input_tokens),
            "x-generated-tokens": str(gen.generated_tokens),
        }
        return generate_response(req, gen), headers

    async def generate_stream(req: GenerateRequest) -> Response:
        chunks = state.client.stream(_spec(state, req, stream=True), state.new_request_id())
        first = await peek(chunks)
        return SSEResponse(tgi_events(req.parameters, req.inputs, first, chunks))

    @router.post("/generate")
    async def generate_route(request: Request) -> Response:
        resp, headers = await generate(request, await parse_body(request, GenerateRequest))
        return JSONResponse(resp.to_json(), headers=headers)

    @router.post("/generate_stream")
    async def generate_stream_route(request: Request) -> Response:
        return await generate_stream(await parse_body(request, GenerateRequest))

    @router.post("/")
    async def compat_generate(request: Request) -> Response:
        req = await parse_body(request, CompatGenerateRequest)
        if req.stream:
            return await generate_stream(req)
        resp, headers = await generate(request, req)
        return JSONResponse([resp.to_json()], headers=headers)

    @router.post("/tokenize")
    async def tokenize_route(request: Request) -> Response:
        req = await parse_body(request, GenerateRequest)
        return JSONResponse([t.model_dump() for t in tokenize(state.tokenizer, req.inputs)])

    return router
