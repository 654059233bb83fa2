"""What every route needs: the config, the Triton client, the tokenizer; and TGI-style body parsing."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError
from starlette.requests import Request

from tgi_llm.front.config import FrontConfig
from tgi_llm.front.errors import FrontError
from tgi_llm.front.protocol import GenerateSpec, TritonGenerateClient
from tgi_llm.gateway.body import BadJson, load_json

#: JSON nesting the front parses (chat messages with content parts and tool schemas stay far below).
MAX_JSON_DEPTH = 64

M = TypeVar("M", bound=BaseModel)


@dataclass
class FrontState:
    config: FrontConfig
    client: TritonGenerateClient
    tokenizer: Any = None

    @staticmethod
    def new_request_id() -> str:
        return uuid.uuid4().hex

    def spec(self, inputs: str | list[int], parameters: dict[str, Any], stream: bool) -> GenerateSpec:
        """A request for Triton, its `stop` list bounded here (as TGI's validation words it) so an oversized
        list is not encoded and sent at all."""
        stop = parameters.get("stop") or []
        limit = self.config.limits.max_stop_sequences
        if len(stop) > limit:
            raise FrontError(f"`stop` supports up to {limit} stop sequences. Given: {len(stop)}", "validation")
        return GenerateSpec(inputs=inputs, parameters=parameters, stream=stream)


async def parse_body(request: Request, model: type[M]) -> M:
    """JSON whatever the Content-Type (curl -d sends a form type), with axum-style messages on failure."""
    raw = await request.body()
    try:
        data = load_json(raw or b"null", MAX_JSON_DEPTH)
    except BadJson as exc:
        raise FrontError(f"Failed to parse the request body as JSON: {exc}", "validation") from None
    try:
        return model.model_validate(data)
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        detail = f"{where}: {first['msg']}" if where else first["msg"]
        raise FrontError(f"Failed to deserialize the JSON body into the target type: {detail}", "validation") from None
