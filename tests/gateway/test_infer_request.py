"""gRPC requests for our model that tritonserver would refuse are recognised before it sees them."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from tgi_llm.gateway.infer_request import BadRequest, check_request, error_response, parse, widen_int32

_DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64",
              np.dtype(np.bool_): "BOOL", np.dtype(np.object_): "BYTES"}


def request(outputs: tuple[str, ...] = (), **tensors: np.ndarray) -> service_pb2.ModelInferRequest:
    """The request tritonclient sends (raw contents) for `text_input` "Hello" plus `tensors`."""
    tensors = {"text_input": np.array([b"Hello"], dtype=np.object_), **tensors}
    inputs = []
    for name, array in tensors.items():
        tensor = grpcclient.InferInput(name, list(array.shape), _DATATYPES[array.dtype])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    req = _get_inference_request(model_name="tgi_llm", inputs=inputs, model_version="", request_id="r1",
                                 outputs=[grpcclient.InferRequestedOutput(o) for o in outputs], sequence_id=0,
                                 sequence_start=False, sequence_end=False, priority=0, timeout=None, parameters=None)
    return parse(req.SerializeToString())


def test_what_tritonclient_sends_passes():
    check_request(request(max_tokens=np.array([4], dtype=np.int32), temperature=np.array([0.5], dtype=np.float32),
                          stop=np.array([b"a", b"bc"], dtype=np.object_), outputs=("text_output",)))


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"top_k": np.array([2.0], dtype=np.float32)}, "`top_k` must be INT32. Given: FP32"),
        ({"max_tokens": np.array([1, 2], dtype=np.int32)}, "`max_tokens` must have shape [1]. Given: [2]"),
        ({"stream": np.array([[True]])}, "`stream` must have shape [1]. Given: [1, 1]"),
    ],
)
def test_wrong_tensors_name_the_input(tensors, message):
    with pytest.raises(BadRequest) as info:
        check_request(request(**tensors))
    assert str(info.value) == message


def test_unknown_input_or_output_missing_prompt_and_shared_memory_are_refused():
    req = request()
    extra = req.inputs.add(name="junk", datatype="INT32", shape=[1])
    extra.contents.int_contents.append(1)
    req.raw_input_contents.append(struct.pack("<i", 1))
    with pytest.raises(BadRequest, match="`junk` is not an input of this model"):
        check_request(req)
    with pytest.raises(BadRequest, match="`nope` is not an output"):
        check_request(request(outputs=("nope",)))
    no_prompt = request()
    del no_prompt.inputs[0]
    del no_prompt.raw_input_contents[0]
    with pytest.raises(BadRequest, match="`text_input` \\(or `input_ids`\\) is required"):
        check_request(no_prompt)
    shm = request()
    shm.inputs[0].parameters["shared_memory_region"].string_param = "x"
    with pytest.raises(BadRequest, match="shared memory is not served"):
        check_request(shm)


def test_element_counts_are_checked_in_raw_and_typed_contents():
    req = request()
    req.raw_input_contents[0] = struct.pack("<I", 5) + b"Hello" + struct.pack("<I", 1) + b"x"  # two strings
    with pytest.raises(BadRequest, match="`text_input` must hold 1 values for shape \\[1\\]. Given: 2"):
        check_request(req)
    req.raw_input_contents[0] = struct.pack("<I", 50) + b"short"
    with pytest.raises(BadRequest, match="truncated string"):
        check_request(req)
    typed = service_pb2.ModelInferRequest(model_name="tgi_llm")
    tensor = typed.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.extend([b"a"])
    check_request(typed)
    tensor.contents.bytes_contents.extend([b"b"])
    with pytest.raises(BadRequest, match="Given: 2"):
        check_request(typed)


def test_garbage_is_not_a_request_and_errors_read_as_tritons():
    with pytest.raises(BadRequest, match="not a valid ModelInferRequest"):
        parse(b"\xff\xff\xff")
    reply = service_pb2.ModelStreamInferResponse.FromString(error_response("`top_k` must be INT32", "r1"))
    assert reply.error_message == "[request id: r1] `top_k` must be INT32"


def _token_ids(values: list[int], datatype: str) -> service_pb2.ModelInferRequest:
    """A token-id prompt in typed contents (`request` gives raw ones)."""
    typed = service_pb2.ModelInferRequest(model_name="tgi_llm")
    tensor = typed.inputs.add(name="input_ids", datatype=datatype, shape=[len(values)])
    getattr(tensor.contents, {"INT32": "int_contents", "INT64": "int64_contents"}[datatype]).extend(values)
    return typed


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_token_ids_are_a_prompt_and_int32_ones_are_widened_in_raw_contents(dtype):
    req = request(input_ids=np.array([1, 2, 49151], dtype=dtype))
    del req.inputs[0]  # no text_input: the token ids are the prompt
    del req.raw_input_contents[0]
    check_request(req)
    assert widen_int32(req) == (dtype == np.int32)
    assert req.inputs[0].datatype == "INT64"
    assert np.frombuffer(req.raw_input_contents[0], "<i8").tolist() == [1, 2, 49151]
    check_request(parse(req.SerializeToString()))


def test_int32_token_ids_are_widened_in_typed_contents():
    req = _token_ids([5, 6], "INT32")
    check_request(req)
    assert widen_int32(req)
    assert req.inputs[0].datatype == "INT64"
    assert list(req.inputs[0].contents.int64_contents) == [5, 6] and not req.inputs[0].contents.int_contents
    check_request(req)


@pytest.mark.parametrize("datatype", ["INT64", "INT32"])
def test_negative_token_ids_are_refused_naming_input_ids(datatype):
    with pytest.raises(BadRequest, match="`input_ids` must hold token ids >= 0. Given: -3"):
        check_request(_token_ids([1, -3], datatype))
    raw = request(input_ids=np.array([-3], dtype={"INT64": np.int64, "INT32": np.int32}[datatype]))
    with pytest.raises(BadRequest, match="`input_ids` must hold token ids >= 0. Given: -3"):
        check_request(raw)


def test_other_token_id_datatypes_and_int32_for_int32_inputs_stay_refused():
    with pytest.raises(BadRequest, match="`input_ids` must be INT64 \\(or INT32\\). Given: FP32"):
        check_request(request(input_ids=np.array([1.0], dtype=np.float32)))
    with pytest.raises(BadRequest, match="`max_tokens` must be INT32. Given: INT64"):
        check_request(request(max_tokens=np.array([4], dtype=np.int64)))
    req = request(max_tokens=np.array([4], dtype=np.int32))
    assert not widen_int32(req)
