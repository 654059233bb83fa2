"""LoRA adapters on the OpenAI routes, as vLLM serves them: the `model` field picks an adapter, /v1/models lists
the base model and every adapter, and with --lora-runtime-loading POST /v1/load_lora_adapter
({"lora_name", "lora_path"}) and /v1/unload_lora_adapter ({"lora_name"}) change them at run time. The model
owns the adapters; these routes ask it through Triton (triton/lora_admin.py)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict

from tgi_llm.front.errors import FrontError
from tgi_llm.front.protocol import GenerateSpec
from tgi_llm.front.state import FrontState
from tgi_llm.triton.lora_admin import ADMIN_PARAMETER


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str
    lora_path: str


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str
    lora_int_id: int | None = None  # vLLM's; names are enough here


async def lora_admin(state: FrontState, body: dict[str, Any]) -> dict[str, Any]:
    """The model's answer to one admin request: {"status", "message", "adapters"}."""
    spec = GenerateSpec("", {ADMIN_PARAMETER: json.dumps(body)})
    text = ""
    async for chunk in state.client.stream(spec, state.new_request_id()):
        text += chunk.text
    try:
        return json.loads(text)
    except ValueError:
        raise FrontError("the model did not answer the LoRA request", "generation") from None


async def adapter_names(state: FrontState) -> list[str]:
    if state.config.lora == "off":
        return []
    return list((await lora_admin(state, {"action": "list"})).get("adapters", []))


def build_router(state: FrontState) -> APIRouter:
    router = APIRouter()
    if state.config.lora != "runtime":
        return router  # vLLM serves these routes only with runtime loading on

    async def change(body: dict[str, Any]) -> Response:
        result = await lora_admin(state, body)
        status = int(result.get("status", 500))
        if status == 200:
            return PlainTextResponse(result.get("message", ""), status_code=200)
        kind = "NotFoundError" if status == 404 else "BadRequestError"
        return JSONResponse({"object": "error", "message": result.get("message", ""), "type": kind, "param": None,
                             "code": status}, status_code=status)

    @router.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        req = await state.parse(request, LoadLoraAdapterRequest)
        return await change({"action": "load", "lora_name": req.lora_name, "lora_path": req.lora_path})

    @router.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        req = await state.parse(request, UnloadLoraAdapterRequest)
        return await change({"action": "unload", "lora_name": req.lora_name})

    return router
