"""What every route needs: the config, the Triton client, the tokenizer; and TGI-style body parsing."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError
from starlette.requests import Request

from tgi_llm.front.config import FrontConfig
from tgi_llm.front.errors import FrontError
from tgi_llm.front.protocol import TritonGenerateClient

M = TypeVar("M", bound=BaseModel)


@dataclass
class FrontState:
    config: FrontConfig
    client: TritonGenerateClient
    tokenizer: Any = None

    @staticmethod
    def new_request_id() -> str:
        return uuid.uuid4().hex


async def parse_body(request: Request, model: type[M]) -> M:
    """JSON whatever the Content-Type (curl -d sends a form type), with axum-style messages on failure."""
    raw = await request.body()
    try:
        data = json.loads(raw or b"null")
    except ValueError as exc:
        raise FrontError(f"Failed to parse the request body as JSON: {exc}", "validation") from None
    try:
        return model.model_validate(data)
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        detail = f"{where}: {first['msg']}" if where else first["msg"]
        raise FrontError(f"Failed to deserialize the JSON body into the target type: {detail}", "validation") from None
