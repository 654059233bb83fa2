"""Triton's error answers, as the statuses clients expect (HTTP and gRPC).

Triton's HTTP generate answers every model error with 400 (an overloaded model too), a model that is
not loaded (yet, or any more) with 400/404 "unknown model", a missing restricted-API header with 403;
its gRPC port answers that header with UNAVAILABLE. TGI answers overload with 429, a model that is not
there with 503, a missing API key with 401: the gateway rewrites these, and only these.
"""

from __future__ import annotations

import grpc

from tgi_llm.gateway.api_key import UNAUTHORIZED
from tgi_llm.triton.status import GRPC_STATUS

OVERLOADED = "Model is overloaded"
SHUTTING_DOWN = "The model is shutting down"
_AUTH_HEADER_HTTP = "expecting header 'authorization'"
_AUTH_HEADER_GRPC = "expecting header 'triton-grpc-protocol-authorization'"


def model_gone(message: str, model: str) -> bool:
    """Triton's words for a model that is not loaded, or whose process died."""
    return (("unknown model" in message and f"'{model}'" in message)
            or ("Stub process" in message and "not healthy" in message)
            or SHUTTING_DOWN in message)


def unavailable_message(model: str) -> str:
    return f"Model `{model}` is not available: it is loading, restarting or stopping"


def http_error(status: int, message: str, model: str) -> tuple[int, str]:
    """(status, message) for a Triton HTTP error answer."""
    if OVERLOADED in message:
        return 429, message
    if model_gone(message, model):
        return 503, unavailable_message(model)
    if status == 403 and _AUTH_HEADER_HTTP in message.lower():
        return 401, UNAUTHORIZED
    return status, message


def grpc_error(code: grpc.StatusCode, message: str, model: str) -> tuple[grpc.StatusCode, str]:
    """(code, message) for a Triton gRPC error status."""
    if _AUTH_HEADER_GRPC in message:
        return grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED
    if model_gone(message, model):
        return grpc.StatusCode.UNAVAILABLE, unavailable_message(model)
    if code == grpc.StatusCode.UNAVAILABLE and OVERLOADED not in message:  # tritonserver not reachable
        return code, unavailable_message(model)
    return code, message


def in_stream_error(message: str, model: str) -> tuple[grpc.StatusCode, str]:
    """The status for an error Triton sent inside a stream without one (it does so for requests it
    refuses before they reach the model, such as a wrong input type, even with `triton_grpc_error`)."""
    if OVERLOADED in message:
        return grpc.StatusCode.UNAVAILABLE, message
    code, message = grpc_error(grpc.StatusCode.INVALID_ARGUMENT, message, model)
    return code, message


def model_error(code: str, message: str, model: str) -> tuple[grpc.StatusCode, str]:
    """The status for an error the model sent with its code (a pb_utils.TritonError name) in its tag: the
    one tritonserver gives such an error in `triton_grpc_error` mode, rewritten as `grpc_error` does."""
    status = getattr(grpc.StatusCode, GRPC_STATUS.get(code, "INTERNAL"), grpc.StatusCode.INTERNAL)
    return grpc_error(status, message, model)
