"""A non-streamed generate, served over tritonserver's gRPC stream so that a client that goes away cancels it.

tritonserver notices that an HTTP client closed its connection only when it writes to it. A streamed generate
writes each token, so closing the upstream connection cancels it; a non-streamed one (`generate`, or
`generate_stream` without `"stream": true`) writes once, at the end, so a client that went away kept its batch
slot and KV blocks until the last token (measured: closing tritonserver's own HTTP connection does not cancel it
either). Over gRPC the gateway cancels the call itself. The body becomes a request as Triton's generate extension
makes one (the model's inputs as tensors of their configured types, `id` the request id, every other key a request
parameter), and the response becomes its JSON (an output of one element is a scalar, others a flat list).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import InferResult, service_pb2

from tgi_llm.launcher.repository import INPUTS

#: Triton config type -> (request datatype, typed-contents field).
_CONTENTS = {"TYPE_STRING": ("BYTES", "bytes_contents"), "TYPE_BOOL": ("BOOL", "bool_contents"),
             "TYPE_INT32": ("INT32", "int_contents"), "TYPE_INT64": ("INT64", "int64_contents"),
             "TYPE_UINT64": ("UINT64", "uint64_contents"), "TYPE_FP32": ("FP32", "fp32_contents")}


def streams(body: dict[str, Any]) -> bool:
    """Whether the body asks for a response per token (`stream` true, as a value or a one-element list)."""
    return body.get("stream") in (True, [True])


def wants_single_response(action: str, body: dict[str, Any]) -> bool:
    """Whether Triton answers this generate body with one response at the end (nothing written before)."""
    return action in ("generate", "generate_stream") and not streams(body)


def to_request(body: dict[str, Any], model: str, inputs: list[tuple[str, str, list[int]]] = INPUTS
               ) -> service_pb2.ModelInferRequest:
    """The gRPC request Triton's generate extension makes of `body` (check_generate_body passed it)."""
    declared = {name: triton_type for name, triton_type, _ in inputs}
    request = service_pb2.ModelInferRequest(model_name=model)
    for key, value in body.items():
        if key in declared:
            datatype, field = _CONTENTS[declared[key]]
            values = value if isinstance(value, list) else [value]
            tensor = request.inputs.add(name=key, datatype=datatype, shape=[len(values)])
            getattr(tensor.contents, field).extend(v.encode() if isinstance(v, str) else v for v in values)
        elif key == "id" and isinstance(value, str):
            request.id = value
        elif isinstance(value, bool):
            request.parameters[key].bool_param = value
        elif isinstance(value, int):
            request.parameters[key].int64_param = value
        else:
            request.parameters[key].string_param = value
    return request


def to_json(response: service_pb2.ModelInferResponse) -> dict[str, Any]:
    """The JSON Triton's generate extension answers for `response`."""
    result = InferResult(response)
    out: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        out["id"] = response.id
    for output in response.outputs:
        values = [_plain(v) for v in np.asarray(result.as_numpy(output.name)).reshape(-1).tolist()]
        out[output.name] = values[0] if len(values) == 1 else values
    return out


def _plain(value: Any) -> Any:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
