"""Error bodies and status codes: TGI's {"error", "error_type"} (422 / 429 / 424) on TGI's routes, OpenAI's
{"error": {"message", "type", "param", "code"}} (400 for a bad request) on /v1."""

from __future__ import annotations

import logging
import re

from fastapi.responses import JSONResponse
from starlette.types import Scope

from tgi_llm.triton.status import GRPC_STATUS, split_error_tag

logger = logging.getLogger("tgi_llm.front")

#: TGI router's status per error_type (server.rs `impl From<InferError> for (StatusCode, Json<ErrorResponse>)`).
STATUS = {
    "validation": 422,
    "overloaded": 429,
    "generation": 424,
    "incomplete_generation": 500,
    "template_error": 422,
    "unauthorized": 401,
    "no fast tokenizer": 404,
    "healthcheck": 503,
    "cancelled": 499,
    "shutdown": 503,
    "unavailable": 503,
}


class FrontError(Exception):
    """An error the client sees as TGI's ErrorResponse."""

    def __init__(self, message: str, error_type: str = "generation") -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type

    @property
    def status(self) -> int:
        return STATUS.get(self.error_type, 500)

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)

    @property
    def openai_status(self) -> int:
        """OpenAI answers 400 to what TGI answers 422 (a request it cannot take as it is)."""
        return 400 if self.status == 422 else self.status

    def openai_body(self) -> dict[str, dict[str, str | None]]:
        """OpenAI's error object, for the /v1 routes: the SDKs show its message and param."""
        kind, code = _OPENAI_TYPES.get(self.error_type, ("server_error", None))
        named = _FIELD.search(self.message)
        return {"error": {"message": self.message, "type": kind, "param": named.group(1) if named else None,
                          "code": code}}

    def openai_response(self) -> JSONResponse:
        return JSONResponse(self.openai_body(), status_code=self.openai_status)


#: error_type -> OpenAI's (type, code).
_OPENAI_TYPES = {
    "validation": ("invalid_request_error", None),
    "template_error": ("invalid_request_error", None),
    "unauthorized": ("invalid_request_error", "invalid_api_key"),
    "overloaded": ("rate_limit_error", "model_overloaded"),
    "unavailable": ("server_error", "model_unavailable"),
    "shutdown": ("server_error", "model_unavailable"),
    "healthcheck": ("server_error", "model_unavailable"),
}
#: The field a validation message names first, in backticks (TGI's wording: "`top_p` must be ...").
_FIELD = re.compile(r"`([A-Za-z_][\w.\[\]]*)`")


def validation(message: str) -> FrontError:
    return FrontError(message, "validation")


_OVERLOADED = "Model is overloaded"


def from_triton(message: str, grpc_status: str | None = None) -> FrontError:
    """Classify an error Triton returned.

    A unary call carries the gRPC status (INVALID_ARGUMENT = validation, UNAVAILABLE = overloaded); the
    model's errors inside a stream carry their code as a tag in the message (triton/status.py); errors
    tritonserver itself sends in a stream carry only the message, so its wording decides there.
    """
    code, message = split_error_tag(message.strip())
    message = _strip_triton_prefix(message)
    status = (grpc_status or GRPC_STATUS.get(code or "", "")).upper()
    if _OVERLOADED.lower() in message.lower() or status.endswith("RESOURCE_EXHAUSTED"):
        return FrontError(_OVERLOADED, "overloaded")
    if status.endswith("UNAVAILABLE"):  # Triton unreachable, or the model shutting down
        return FrontError(message or "Triton is unavailable", "unavailable")
    if status.endswith("NOT_FOUND") or _model_gone(message):  # not loaded (yet, or any more): TGI's 503
        return FrontError(f"The model is not available: {message}" if message else "The model is not available",
                          "unavailable")
    if status.endswith("INVALID_ARGUMENT") or (code is None and _looks_like_validation(message)):
        return FrontError(message, "validation")
    if status.endswith("CANCELLED"):
        return FrontError(message or "Request was cancelled", "cancelled")
    return FrontError(message or "Request failed during generation", "generation")


def _model_gone(message: str) -> bool:
    return "unknown model" in message or ("Stub process" in message and "not healthy" in message)


def _strip_triton_prefix(message: str) -> str:
    # Triton prepends "[request id: X] " to errors of requests that carry an id.
    message = message.strip()
    if message.startswith("[request id:"):
        end = message.find("] ")
        if end != -1:
            message = message[end + 2 :]
    return message


#: The shapes of TGI's validation messages (validation.rs): they name a field in backticks, or say what is
#: not supported/allowed. Only used when the status code did not come with the message (streaming gRPC).
_VALIDATION_MARKERS = ("must be", "is not supported", "not allowed", "cannot be empty", "Input validation error")


def _looks_like_validation(message: str) -> bool:
    return message.startswith("`") or any(marker in message for marker in _VALIDATION_MARKERS)


def report_unhandled(scope: Scope, exc: Exception) -> None:
    """One log line for an exception no route turned into an error (tgi_llm.gateway.unhandled)."""
    # %r: the message on one line, any lone surrogate escaped (a raw one breaks the log handler).
    logger.error("%s %s failed: %s: %r", scope["method"], scope["path"], type(exc).__name__, str(exc)[:500])


def unhandled_answer(scope: Scope, exc: Exception) -> JSONResponse:
    """A JSON 500 in the route's API shape."""
    err = FrontError(f"Internal server error ({type(exc).__name__})", "internal")
    return err.openai_response() if scope["path"].startswith("/v1/") else err.response()
