"""The FastAPI app: TGI's and OpenAI's routes over one Triton client, the API key, TGI's error bodies."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from tgi_llm.front import lora_routes, openai_routes, tgi_routes
from tgi_llm.front.config import FrontConfig
from tgi_llm.front.errors import FrontError, report_unhandled, unhandled_answer
from tgi_llm.front.protocol import TritonGenerateClient
from tgi_llm.front.state import FrontState
from tgi_llm.gateway.api_key import ApiKey
from tgi_llm.gateway.body import BodyLimit, PayloadTooLarge
from tgi_llm.gateway.unhandled import UnhandledErrors


def _api_key_check(config: FrontConfig):
    api_key = ApiKey(config.api_key or None)

    async def check(request: Request) -> None:
        # The gateway's check: the scheme case-insensitive, the key exact, in constant time.
        if not api_key.allows(request.headers.get("authorization")):
            raise FrontError("Unauthorized", "unauthorized")

    return check


def _public_router(state: FrontState) -> APIRouter:
    """Health and metrics: never behind the API key (load balancers and Prometheus call them)."""
    router = APIRouter()

    async def health() -> Response:
        if await state.client.ready():
            return Response(status_code=200)
        raise FrontError("unhealthy", "healthcheck")

    router.add_api_route("/health", health, methods=["GET"])
    router.add_api_route("/ping", health, methods=["GET"])
    router.add_api_route("/", health, methods=["GET"])

    @router.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(await state.client.metrics(), media_type="text/plain; version=0.0.4")

    return router


def create_app(config: FrontConfig, client: TritonGenerateClient, tokenizer: Any = None) -> FastAPI:
    state = FrontState(config=config, client=client, tokenizer=tokenizer)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        state.workers.shutdown(wait=False, cancel_futures=True)
        await client.close()

    app = FastAPI(title="tgi-llm", version=config.version, lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.state.front = state

    @app.exception_handler(FrontError)
    async def front_error(request: Request, exc: FrontError) -> Response:
        # OpenAI's error object on OpenAI's routes (its SDKs read it), TGI's elsewhere.
        return exc.openai_response() if request.url.path.startswith("/v1/") else exc.response()

    guarded = APIRouter(dependencies=[Depends(_api_key_check(config))])

    @guarded.get("/info")
    async def info() -> Response:
        return JSONResponse(config.info())

    guarded.include_router(tgi_routes.build_router(state))
    guarded.include_router(openai_routes.build_router(state))
    guarded.include_router(lora_routes.build_router(state))
    app.include_router(_public_router(state))
    app.include_router(guarded)
    app.add_middleware(UnhandledErrors, answer=unhandled_answer, report=report_unhandled)
    # Outermost: a body over --payload-limit is refused before anything reads it.
    app.add_middleware(BodyLimit, limit=config.payload_limit, too_large=_too_large)
    return app


def _too_large(exc: PayloadTooLarge) -> JSONResponse:
    return JSONResponse({"error": str(exc), "error_type": "validation"}, status_code=413)
