"""What every route needs: the config, the Triton client, the tokenizer, a pool for CPU work; and TGI-style
body parsing."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError
from starlette.requests import Request

from tgi_llm.engine.validation import longest_token_chars, too_long
from tgi_llm.front.config import FrontConfig
from tgi_llm.front.errors import FrontError, validation
from tgi_llm.front.protocol import GenerateSpec, TritonGenerateClient
from tgi_llm.front.reasoning import has_reasoning_tags
from tgi_llm.gateway.body import BadJson, load_json

#: JSON nesting the front parses (chat messages with content parts and tool schemas stay far below).
MAX_JSON_DEPTH = 64

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


@dataclass
class FrontState:
    config: FrontConfig
    client: TritonGenerateClient
    tokenizer: Any = None
    #: Parsing, chat templates, grammars and tokenizing run here, off the event loop that answers /health:
    #: as many threads as TGI's --validation-workers (its tokenizer workers).
    workers: ThreadPoolExecutor = field(init=False)
    max_token_chars: int | None = field(init=False)
    #: Whether chat answers split a <think> part into `reasoning_content` (front/reasoning.py).
    splits_reasoning: bool = field(init=False)

    def __post_init__(self) -> None:
        self.workers = ThreadPoolExecutor(max(1, self.config.limits.validation_workers), "front-cpu")
        self.max_token_chars = longest_token_chars(self.tokenizer) if self.tokenizer is not None else None
        self.splits_reasoning = self.config.reasoning_format == "auto" and has_reasoning_tags(self.tokenizer)

    @staticmethod
    def new_request_id() -> str:
        return uuid.uuid4().hex

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread. The tokenizer's Rust releases the GIL; Python code (jinja templates)
        hands it back to the loop every switch interval (5 ms); one C call that keeps it (json.loads, pydantic's
        validation: ~0.25 s each for a 2 MB body of 60,000 messages) still delays the loop that long."""
        return await asyncio.get_running_loop().run_in_executor(self.workers, functools.partial(fn, *args))

    async def parse(self, request: Request, model: type[M]) -> M:
        """The body as `model` (a 2 MB body takes ~0.5 s to parse and validate: in a worker)."""
        return await self.off_loop(parse_body, await request.body(), model)

    def check_length(self, name: str, chars: int, what: str = "characters") -> None:
        """Refuse text too long to be a prompt before anything tokenizes or renders it: more characters than
        max_input_tokens tokens of the vocabulary's longest entry can hold (the engine's own bound)."""
        limit = self.config.limits.max_input_tokens
        if limit is None or self.max_token_chars is None:
            return
        refusal = too_long(name, chars, limit, self.max_token_chars, what)
        if refusal is not None:
            raise validation(refusal)

    def spec(self, inputs: str | list[int], parameters: dict[str, Any], stream: bool) -> GenerateSpec:
        """A request for Triton, its `stop` list bounded here (as TGI's validation words it) so an oversized
        list is not encoded and sent at all."""
        stop = parameters.get("stop") or []
        limit = self.config.limits.max_stop_sequences
        if len(stop) > limit:
            raise FrontError(f"`stop` supports up to {limit} stop sequences. Given: {len(stop)}", "validation")
        return GenerateSpec(inputs=inputs, parameters=parameters, stream=stream)


def parse_body(raw: bytes, model: type[M]) -> M:
    """JSON whatever the Content-Type (curl -d sends a form type), with axum-style messages on failure;
    load_json refuses what UTF-8 and TGI's parser cannot take (lone surrogates, NaN), naming where."""
    try:
        data = load_json(raw or b"null", MAX_JSON_DEPTH)
    except BadJson as exc:
        raise FrontError(f"Failed to parse the request body as JSON: {exc}", "validation") from None
    try:
        return model.model_validate(data)
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        detail = f"`{where}`: {first['msg']}" if where else first["msg"]
        raise FrontError(f"Failed to deserialize the JSON body into the target type: {detail}", "validation") from None
