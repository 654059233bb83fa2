"""Checks on a gRPC inference request for our model, made before tritonserver sees it.

tritonserver 2.51 itself refuses a request whose inputs do not match the model's config (a wrong
datatype, shape or element count, an unknown input, a shared-memory region) before it reaches the
model; but if the client's stream is then cancelled, the refused request keeps a reference to the
model, and the next graceful stop waits out --graceful-termination-timeout and exits 1 without the
model's finalize (reproduced: a FP32 `top_k`, then a cancelled stream). So such requests never go
to tritonserver: the gateway answers them itself, naming the input.
"""

from __future__ import annotations

import struct
from math import prod

from tritonclient.grpc import service_pb2

from tgi_llm.launcher.repository import INPUTS, OUTPUTS

#: Triton config type -> the datatype a request must carry, and its typed-contents field and byte size.
_TYPES = {
    "TYPE_STRING": ("BYTES", "bytes_contents", None),
    "TYPE_BOOL": ("BOOL", "bool_contents", 1),
    "TYPE_INT32": ("INT32", "int_contents", 4),
    "TYPE_UINT64": ("UINT64", "uint64_contents", 8),
    "TYPE_FP32": ("FP32", "fp32_contents", 4),
}
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
        datatype, field, size = _TYPES[triton_type]
        if tensor.datatype != datatype:
            raise BadRequest(f"`{name}` must be {datatype}. Given: {tensor.datatype or 'no datatype'}")
        shape = list(tensor.shape)
        fits = len(shape) == len(dims) and all(d in (-1, s) and s >= 0 for s, d in zip(shape, dims, strict=True))
        if not fits:
            raise BadRequest(f"`{name}` must have shape {dims}. Given: {shape}")
        count = prod(shape)
        given = _raw_count(name, raw[index], size) if raw else len(getattr(tensor.contents, field))
        if given != count:
            raise BadRequest(f"`{name}` must hold {count} values for shape {shape}. Given: {given}")
    if "text_input" in declared and "text_input" not in seen:
        raise BadRequest("`text_input` is required")
    known_outputs = {name for name, _, _ in outputs}
    for output in request.outputs:
        if output.name not in known_outputs:
            raise BadRequest(f"`{output.name}` is not an output of this model")
        if _SHARED_MEMORY in output.parameters:
            raise BadRequest(f"`{output.name}`: shared memory is not served to clients")


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


def error_response(message: str, request_id: str = "") -> bytes:
    """An in-stream error, as tritonserver sends one to a client that did not ask for statuses."""
    prefix = f"[request id: {request_id}] " if request_id else ""
    return service_pb2.ModelStreamInferResponse(error_message=prefix + message).SerializeToString()
