"""Checks on a gRPC inference request for our model, made before tritonserver sees it.

tritonserver 2.51 itself refuses a request whose inputs do not match the model's config (a wrong
datatype, shape or element count, an unknown input, a shared-memory region) before it reaches the
model; but if the client's stream is then cancelled, the refused request keeps a reference to the
model, and the next graceful stop waits out --graceful-termination-timeout and exits 1 without the
model's finalize (reproduced: a FP32 `top_k`, then a cancelled stream). So such requests never go
to tritonserver: the gateway answers them itself, naming the input, as it does negative token ids.
Token ids sent as INT32 (as many clients hold them) are widened to the INT64 the model declares.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from tgi_llm.gateway.generate_body import TOKEN_IDS, negative_token_id
from tgi_llm.launcher.repository import INPUTS, OUTPUTS

#: Triton config type -> the datatype a request must carry.
_TYPES = {"TYPE_STRING": "BYTES", "TYPE_BOOL": "BOOL", "TYPE_INT32": "INT32", "TYPE_INT64": "INT64",
          "TYPE_UINT64": "UINT64", "TYPE_FP32": "FP32"}
#: Datatype -> its typed-contents field and byte size (BYTES: length-prefixed).
_CONTENTS = {"BYTES": ("bytes_contents", None), "BOOL": ("bool_contents", 1), "INT32": ("int_contents", 4),
             "INT64": ("int64_contents", 8), "UINT64": ("uint64_contents", 8), "FP32": ("fp32_contents", 4)}
#: INT64 inputs also take INT32 tensors, widened before forwarding (widen_int32).
_NARROW = {"INT64": "INT32"}
#: Raw integer datatypes whose values are checked.
_NUMPY = {"INT32": "<i4", "INT64": "<i8"}
_SHARED_MEMORY = "shared_memory_region"


class BadRequest(ValueError):
    """The message names the input."""


def parse(raw: bytes) -> service_pb2.ModelInferRequest:
    try:
        return service_pb2.ModelInferRequest.FromString(raw)
    except Exception:  # protobuf's DecodeError
        raise BadRequest("the request is not a valid ModelInferRequest") from None


def check_request(request: service_pb2.ModelInferRequest,
                  inputs: list[tuple[str, str, list[int]]] = INPUTS,
                  outputs: list[tuple[str, str, list[int]]] = OUTPUTS) -> None:
    """Raise BadRequest unless tritonserver would accept `request`'s tensors for this model."""
    declared = {name: (triton_type, dims) for name, triton_type, dims in inputs}
    seen: set[str] = set()
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"`raw_input_contents` must hold one entry per input. Given: {len(raw)} for "
                         f"{len(request.inputs)} inputs")
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        if name not in declared:
            raise BadRequest(f"`{name}` is not an input of this model (inputs: {', '.join(declared)})")
        if name in seen:
            raise BadRequest(f"`{name}` is given twice")
        seen.add(name)
        if _SHARED_MEMORY in tensor.parameters:
            raise BadRequest(f"`{name}`: shared memory is not served to clients")
        triton_type, dims = declared[name]
        datatype = _TYPES[triton_type]
        if tensor.datatype not in (datatype, _NARROW.get(datatype)):
            also = f" (or {_NARROW[datatype]})" if datatype in _NARROW else ""
            raise BadRequest(f"`{name}` must be {datatype}{also}. Given: {tensor.datatype or 'no datatype'}")
        shape = list(tensor.shape)
        fits = len(shape) == len(dims) and all(d in (-1, s) and s >= 0 for s, d in zip(shape, dims, strict=True))
        if not fits:
            raise BadRequest(f"`{name}` must have shape {dims}. Given: {shape}")
        count = prod(shape)
        values = _values(name, tensor, raw[index] if raw else None)
        if len(values) != count:
            raise BadRequest(f"`{name}` must hold {count} values for shape {shape}. Given: {len(values)}")
        _check_values(name, values)
    if "text_input" in declared and not seen & {"text_input", "input_ids"}:
        raise BadRequest("`text_input` (or `input_ids`) is required")
    known_outputs = {name for name, _, _ in outputs}
    for output in request.outputs:
        if output.name not in known_outputs:
            raise BadRequest(f"`{output.name}` is not an output of this model")
        if _SHARED_MEMORY in output.parameters:
            raise BadRequest(f"`{output.name}`: shared memory is not served to clients")


def widen_int32(request: service_pb2.ModelInferRequest,
                inputs: list[tuple[str, str, list[int]]] = INPUTS) -> bool:
    """Rewrite INT32 tensors of INT64 inputs (check_request passed them) as INT64, in typed or raw contents;
    True if any was. tritonserver would refuse them: it takes only the declared datatype."""
    widened = False
    int64 = {name for name, triton_type, _ in inputs if triton_type == "TYPE_INT64"}
    for index, tensor in enumerate(request.inputs):
        if tensor.name not in int64 or tensor.datatype != "INT32":
            continue
        tensor.datatype = "INT64"
        if request.raw_input_contents:
            data = request.raw_input_contents[index]
            request.raw_input_contents[index] = np.frombuffer(data, _NUMPY["INT32"]).astype(_NUMPY["INT64"]).tobytes()
        else:
            tensor.contents.int64_contents.extend(tensor.contents.int_contents)
            tensor.contents.ClearField("int_contents")
        widened = True
    return widened


def _values(name: str, tensor: service_pb2.ModelInferTensor, data: bytes | None) -> Sequence[Any]:
    """The tensor's elements, from its raw entry `data` when the request has raw contents, else its typed
    contents; raw values are decoded only where they are checked (integers), else counted."""
    field, size = _CONTENTS[tensor.datatype]
    if data is None:
        return getattr(tensor.contents, field)
    count = _raw_count(name, data, size)
    return np.frombuffer(data, _NUMPY[tensor.datatype]).tolist() if tensor.datatype in _NUMPY else range(count)


def _raw_count(name: str, data: bytes, size: int | None) -> int:
    """Elements in a raw_input_contents entry; BYTES are 4-byte little-endian length-prefixed."""
    if size is not None:
        if len(data) % size:
            raise BadRequest(f"`{name}` holds {len(data)} bytes, not a whole number of {size}-byte values")
        return len(data) // size
    count, offset = 0, 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise BadRequest(f"`{name}` holds a truncated string")
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4 + length
        if offset > len(data):
            raise BadRequest(f"`{name}` holds a truncated string")
        count += 1
    return count


def _check_values(name: str, values: Sequence[Any]) -> None:
    """Token ids the model would refuse less clearly: negative ones (the engine names the vocabulary bound)."""
    if name in TOKEN_IDS:
        for value in values:
            if value < 0:
                raise BadRequest(negative_token_id(name, value))


def error_response(message: str, request_id: str = "") -> bytes:
    """An in-stream error, as tritonserver sends one to a client that did not ask for statuses."""
    prefix = f"[request id: {request_id}] " if request_id else ""
    return service_pb2.ModelStreamInferResponse(error_message=prefix + message).SerializeToString()
