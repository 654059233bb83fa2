"""Non-streamed generate bodies become the gRPC request Triton's generate extension makes of them, and
responses the JSON it answers (checked against tritonserver's own answers in tests/integration)."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tgi_llm.gateway.generate_grpc import to_json, to_request, wants_single_response


@pytest.mark.parametrize(
    ("action", "body", "single"),
    [
        ("generate", {"text_input": "hi"}, True),
        ("generate", {"text_input": "hi", "stream": False}, True),
        ("generate_stream", {"text_input": "hi"}, True),
        ("generate_stream", {"text_input": "hi", "stream": True}, False),
        ("generate", {"text_input": "hi", "stream": True}, False),  # Triton refuses it after the 2nd response
        ("infer", {"inputs": []}, False),
    ],
)
def test_which_requests_get_one_response(action, body, single):
    assert wants_single_response(action, body) is single


def test_inputs_become_tensors_of_their_config_type_and_other_keys_parameters():
    request = to_request({"text_input": "héllo", "input_ids": [1, 2], "max_tokens": 3, "temperature": 1,
                          "seed": 2**64 - 1, "stop": ["a", "b"], "ignore_eos": True, "id": "r7",
                          "details": True, "top_n_tokens": 2, "grammar": "{}", "flag": False, "n": 2}, "tgi_llm")
    assert request.model_name == "tgi_llm" and request.id == "r7"
    tensors = {t.name: t for t in request.inputs}
    assert tensors["text_input"].datatype == "BYTES" and list(tensors["text_input"].shape) == [1]
    assert list(tensors["text_input"].contents.bytes_contents) == ["héllo".encode()]
    assert tensors["input_ids"].datatype == "INT64" and list(tensors["input_ids"].contents.int64_contents) == [1, 2]
    assert list(tensors["max_tokens"].contents.int_contents) == [3]
    assert list(tensors["temperature"].contents.fp32_contents) == [1.0]
    assert list(tensors["seed"].contents.uint64_contents) == [2**64 - 1]
    assert list(tensors["stop"].shape) == [2]
    assert list(tensors["ignore_eos"].contents.bool_contents) == [True]
    assert request.parameters["grammar"].string_param == "{}"
    assert request.parameters["flag"].WhichOneof("parameter_choice") == "bool_param"
    assert request.parameters["n"].int64_param == 2
    assert "id" not in request.parameters


def test_outputs_become_scalars_or_flat_lists_as_tritons_generate_writes_them():
    response = service_pb2.ModelInferResponse(model_name="tgi_llm", model_version="1", id="r7")
    arrays = {"text_output": np.array([b"'s"], dtype=np.object_), "num_output_tokens": np.array([1], np.uint32),
              "token_ids": np.array([5, 6], np.int64), "token_special": np.array([False]),
              "top_token_texts": np.array([[b"a", b"b"], [b"c", b"d"]], dtype=np.object_),
              "token_logprobs": np.array([-1.25], np.float32)}
    for name, array in arrays.items():
        datatype = {"O": "BYTES", "u": "UINT32", "i": "INT64", "b": "BOOL", "f": "FP32"}[array.dtype.kind]
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if datatype == "BYTES":
            flat = array.reshape(-1)
            raw = b"".join(len(v).to_bytes(4, "little") + v for v in flat)
        else:
            raw = array.tobytes()
        response.raw_output_contents.append(raw)
    assert to_json(response) == {
        "model_name": "tgi_llm", "model_version": "1", "id": "r7", "text_output": "'s", "num_output_tokens": 1,
        "token_ids": [5, 6], "token_special": False, "top_token_texts": ["a", "b", "c", "d"], "token_logprobs": -1.25,
    }
