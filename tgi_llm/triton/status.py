"""Which Triton error code each engine error travels with (names of `pb_utils.TritonError` codes).

gRPC clients see the code when they open the stream with the header `triton_grpc_error: true`
(otherwise Triton reports only the message); HTTP generate answers 400 with the message.
"""

from __future__ import annotations

from tgi_llm.errors import CancelledError, OverloadedError, ShutdownError, TgiError, ValidationError

_CODES: list[tuple[type[TgiError], str]] = [
    (ValidationError, "INVALID_ARG"),
    (OverloadedError, "UNAVAILABLE"),
    (ShutdownError, "UNAVAILABLE"),
    (CancelledError, "CANCELLED"),
]


def triton_code(error: BaseException) -> str:
    for cls, code in _CODES:
        if isinstance(error, cls):
            return code
    return "INTERNAL"


def failure_label(error: BaseException) -> str:
    """TGI's `err` label of tgi_request_failure (its error_type: validation, overloaded, generation...)."""
    return getattr(error, "error_type", "generation")
