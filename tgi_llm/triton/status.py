"""Which Triton error code each engine error travels with (names of `pb_utils.TritonError` codes), and the
tag that carries the code inside an error message.

A gRPC stream opened with the header `triton_grpc_error: true` gets the code as its status, but
tritonserver's handling of that mode crashes it (SIGSEGV, a use-after-free when the model's error ends the
stream: ~1,000 refused requests did it here, pytriton 0.7's tritonserver; fixed upstream later;
docs/RELIABILITY.md). So nothing of ours sends that header to tritonserver: the front and the gateway ask for
the code with the request parameter `tgi_llm_error_code` instead, the model then starts each error message
with `[tgi_llm <CODE>] `, and they take the tag off before anyone sees the message.
HTTP generate answers 400 with the message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tgi_llm.errors import CancelledError, OverloadedError, ShutdownError, TgiError, ValidationError

_CODES: list[tuple[type[TgiError], str]] = [
    (ValidationError, "INVALID_ARG"),
    (OverloadedError, "UNAVAILABLE"),
    (ShutdownError, "UNAVAILABLE"),
    (CancelledError, "CANCELLED"),
]

#: pb_utils.TritonError code names -> the gRPC status (grpc.StatusCode names) tritonserver gives them.
GRPC_STATUS = {"INVALID_ARG": "INVALID_ARGUMENT", "UNAVAILABLE": "UNAVAILABLE", "CANCELLED": "CANCELLED",
               "INTERNAL": "INTERNAL", "NOT_FOUND": "NOT_FOUND", "ALREADY_EXISTS": "ALREADY_EXISTS",
               "UNSUPPORTED": "UNIMPLEMENTED", "UNKNOWN": "UNKNOWN"}

#: The request parameter (bool) with which a client asks for tagged error messages.
ERROR_CODE_PARAMETER = "tgi_llm_error_code"
#: The tag, after the "[request id: X] " that tritonserver may put first.
_TAG = re.compile(r"^(\[request id: [^\]]*\] )?\[tgi_llm ([A-Z_]+)\] ")


def triton_code(error: BaseException) -> str:
    for cls, code in _CODES:
        if isinstance(error, cls):
            return code
    return "INTERNAL"


def failure_label(error: BaseException) -> str:
    """TGI's `err` label of tgi_request_failure (its error_type: validation, overloaded, generation...)."""
    return getattr(error, "error_type", "generation")


def wants_error_code(parameters: str | Mapping[str, Any] | None) -> bool:
    """Whether a request's parameters (Triton's JSON text) ask for tagged error messages."""
    if not parameters or ERROR_CODE_PARAMETER not in parameters:
        return False
    try:
        values = json.loads(parameters) if isinstance(parameters, str) else parameters
        return values.get(ERROR_CODE_PARAMETER) is True
    except (ValueError, AttributeError):
        return False


@dataclass(frozen=True)
class CodeTaggingSender:
    """The response sender of a request that asked for tagged error messages (PbResponses tags them)."""

    sender: Any

    def send(self, *args: Any, **kwargs: Any) -> Any:
        return self.sender.send(*args, **kwargs)

    def is_cancelled(self) -> bool:
        return self.sender.is_cancelled()


def tag_error(message: str, code: str) -> str:
    return f"[tgi_llm {code}] {message}"


def split_error_tag(message: str) -> tuple[str | None, str]:
    """(the code, the message without its tag); (None, message) for a message without one."""
    match = _TAG.match(message)
    if match is None:
        return None, message
    return match.group(2), (match.group(1) or "") + message[match.end():]
