"""The gateway against an adversarial client, on the real server: token-id prompts (INT64 and INT32) and bad ids,
non-streamed generates cancelled when their client leaves, and text that is not valid Unicode."""

from __future__ import annotations

import http.client
import json
import socket
import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tgi_llm.gateway.generate_grpc import to_json

from .harness import MODEL, Launched, http_generate, loopback, metric, read_metrics, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT_IDS = [1, 504, 3458, 282]
_CONTENTS = {"BYTES": "bytes_contents", "BOOL": "bool_contents", "INT32": "int_contents", "INT64": "int64_contents"}
_RAW = {"BOOL": "?", "INT32": "<i4", "INT64": "<i8"}


def kv_settled(server: Launched) -> bool:
    """Every block free and nothing queued or running (as tests/integration/test_server.py waits for it)."""
    snap = read_metrics(server)
    total = metric(snap, "tgi_kv_blocks_total")
    return total > 0 and metric(snap, "tgi_kv_blocks_free") == total \
        and metric(snap, "tgi_queue_size") == 0 and metric(snap, "tgi_batch_current_size") == 0


def infer_request(raw: bool = False, **tensors: tuple[str, list]) -> service_pb2.ModelInferRequest:
    """A request with `tensors` (name: (datatype, values)), in typed contents or, with `raw`, raw ones."""
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    for name, (datatype, values) in tensors.items():
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[len(values)])
        if not raw:
            getattr(tensor.contents, _CONTENTS[datatype]).extend(values)
        elif datatype == "BYTES":
            request.raw_input_contents.append(b"".join(len(v).to_bytes(4, "little") + v for v in values))
        else:
            request.raw_input_contents.append(np.array(values, _RAW[datatype]).tobytes())
    return request


def stream_infer(server: Launched, request: service_pb2.ModelInferRequest,
                 status_header: bool = True) -> list[service_pb2.ModelStreamInferResponse]:
    """The responses to `request` on its own ModelStreamInfer stream, read to the stream's end (the client
    half-closes after its one request, so the server ends it); the call's status is raised as grpc.RpcError.
    The deadline is a hang guard: the client must never wait forever."""
    with grpc.insecure_channel(server.grpc) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")(
            iter([request.SerializeToString()]), timeout=120,
            metadata=(("triton_grpc_error", "true"),) if status_header else ())
        return [service_pb2.ModelStreamInferResponse.FromString(raw) for raw in call]


# ---- (2) token-id prompts ----


@pytest.mark.parametrize("raw", [False, True], ids=["typed", "raw"])
@pytest.mark.parametrize("datatype", ["INT64", "INT32"])
@pytest.mark.parametrize("status_header", [True, False], ids=["status", "in-stream"])
def test_token_id_prompts_are_served_over_grpc_as_int64_and_int32(server, raw, datatype, status_header):
    status, expected = http_generate(server, {"input_ids": PROMPT_IDS, "max_tokens": 4, "ignore_eos": True})
    assert status == 200 and expected["num_input_tokens"] == len(PROMPT_IDS)
    request = infer_request(raw, input_ids=(datatype, PROMPT_IDS), max_tokens=("INT32", [4]),
                            ignore_eos=("BOOL", [True]))
    responses = stream_infer(server, request, status_header)
    assert [r.error_message for r in responses] == [""]
    answer = to_json(responses[0].infer_response)
    assert answer["text_output"] == expected["text_output"]
    assert answer["num_input_tokens"] == len(PROMPT_IDS) and answer["num_output_tokens"] == 4


@pytest.mark.parametrize("datatype", ["INT64", "INT32"])
@pytest.mark.parametrize(("ids", "message"), [
    ([5, -1], "`input_ids` must hold token ids >= 0. Given: -1"),
    ([5, 49152], "token ids must be integers in [0, 49152). Given: 49152"),  # the engine knows the vocabulary
])
def test_bad_token_ids_get_invalid_argument_over_grpc(server, datatype, ids, message):
    request = infer_request(input_ids=(datatype, ids), max_tokens=("INT32", [2]))
    with pytest.raises(grpc.RpcError) as info:
        stream_infer(server, request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()
    (response,) = stream_infer(server, request, status_header=False)  # in the stream, without the header
    assert message in response.error_message
    assert kv_settled(server) or wait_until(lambda: kv_settled(server))


@pytest.mark.parametrize(("ids", "message"), [
    ([5, -1], "`input_ids` must hold token ids >= 0. Given: -1"),
    ([5, 49152], "token ids must be integers in [0, 49152). Given: 49152"),
    ([5, 2**64], "`input_ids` must be >= -9223372036854775808 and <= 9223372036854775807"),  # was Triton's 500
    ([5, 1.5], "`input_ids` must be an integer"),
])
def test_bad_token_ids_get_400_over_http(server, ids, message):
    status, answer = http_generate(server, {"input_ids": ids, "max_tokens": 2})
    assert status == 400 and message in answer["error"]


# ---- (3) a client that leaves a non-streamed generate cancels it ----


@pytest.mark.parametrize(("route", "extra"), [
    ("generate", {}),
    ("generate_stream", {}),
    ("generate_stream", {"stream": False}),
])
def test_a_client_leaving_a_non_streamed_generate_cancels_it(server, route, extra):
    assert wait_until(lambda: kv_settled(server))
    before = metric(read_metrics(server), "tgi_request_failure", err="cancelled")
    body = json.dumps({"text_input": "What is deep learning?", "max_tokens": 400, "ignore_eos": True, **extra})
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
        sock.sendall(f"POST /v2/models/{MODEL}/{route} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        assert wait_until(lambda: metric(read_metrics(server), "tgi_batch_current_size") == 1, 30)
        time.sleep(1.0)
    # 400 tokens take ~10 s or more here: cancelled, the request ends well before that.
    assert wait_until(lambda: metric(read_metrics(server), "tgi_request_failure", err="cancelled") == before + 1, 5)
    assert wait_until(lambda: kv_settled(server), 5)
    assert http_generate(server, {"text_input": "Hello", "max_tokens": 2})[0] == 200


@pytest.mark.parametrize(("route", "body"), [
    ("generate", {"text_input": "What is deep learning?", "max_tokens": 3, "details": True, "top_n_tokens": 2,
                  "decoder_input_details": True, "id": "r1", "return_full_text": True}),
    ("generate", {"input_ids": PROMPT_IDS, "max_tokens": 2, "seed": 3, "temperature": 0.5, "details": True}),
    ("generate", {"text_input": "Hi", "max_tokens": 2, "top_p": 1.5}),
    ("generate_stream", {"text_input": "Hi", "max_tokens": 2, "stream": False}),
    ("generate_stream", {"text_input": "Hi", "max_tokens": 2, "temperature": -1}),
])
def test_non_streamed_generates_answer_as_tritons_own_http_does(server, route, body):
    """Served over gRPC by the gateway, answered as tritonserver's HTTP answers the same body."""
    def post(base: str) -> tuple[int, str, str]:
        conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=120)
        conn.request("POST", f"/v2/models/{MODEL}/{route}", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type"), response.read().decode()

    def parsed(text: str) -> dict:
        return json.loads(text.removeprefix("data: ").strip())

    status, content_type, text = post(server.http)
    want_status, want_type, want_text = post(loopback(server).http)
    assert status == want_status and parsed(text) == parsed(want_text)
    if status == 200:  # errors are JSON on every generate route of the gateway (statuses.py rewrites them)
        assert content_type == want_type and text.startswith("data: ") == want_text.startswith("data: ")
    else:
        assert content_type == "application/json"


# ---- (4) text that is not valid Unicode ----


@pytest.mark.parametrize(("path", "body", "field"), [
    (f"/v2/models/{MODEL}/generate", b'{"text_input": "a\\ud800b", "max_tokens": 2}', "`text_input`"),
    (f"/v2/models/{MODEL}/generate_stream", b'{"text_input": "a", "stop": ["\\udc00"], "stream": true}', "`stop.0`"),
    ("/v2/models/other/infer", b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["\\ud800"]}]}',
     "`inputs.0.data.0`"),
    (f"/v2/models/{MODEL}/generate", b'{"text_input": "a\xff", "max_tokens": 2}', "not valid JSON"),
])
def test_lone_surrogates_and_invalid_utf8_get_400_naming_the_field_on_a_kept_connection(server, path, body, field):
    log_size = server.log_path.stat().st_size
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    answer = json.loads(response.read())
    assert response.status == 400 and field in answer["error"]
    sock = conn.sock
    assert sock is not None  # kept alive: http.client closes it when the answer says it will close
    conn.request("POST", f"/v2/models/{MODEL}/generate", json.dumps({"text_input": "Hello", "max_tokens": 2}))
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read())["num_output_tokens"] == 2
    assert conn.sock is sock
    conn.close()
    assert "Traceback" not in server.log_path.read_bytes()[log_size:].decode(errors="replace")


@pytest.mark.parametrize("raw", [False, True], ids=["typed", "raw"])
@pytest.mark.parametrize("name", ["text_input", "stop", "sampling_parameters", "guided_decoding_guide"])
def test_bytes_tensors_that_are_not_utf8_get_invalid_argument_naming_the_input(server, raw, name):
    tensors = {"text_input": ("BYTES", [b"Hello"]), "max_tokens": ("INT32", [2])}
    if name == "guided_decoding_guide":
        tensors["guided_decoding_guide_type"] = ("BYTES", [b"regex"])
    tensors[name] = ("BYTES", [b"a\xff\xfe"])
    log_size = server.log_path.stat().st_size
    with pytest.raises(grpc.RpcError) as info:
        stream_infer(server, infer_request(raw, **tensors))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"`{name}`" in info.value.details() and "UTF-8" in info.value.details()
    assert "Traceback" not in server.log_path.read_bytes()[log_size:].decode(errors="replace")


@pytest.mark.parametrize("stream", [True, [True]])
def test_generate_asked_to_stream_is_a_400_pointing_to_generate_stream(server, stream):
    """Triton answered 200 with an error body ("generate expects model to produce exactly 1 response"): the
    fuzzer found it."""
    status, body = http_generate(server, {"text_input": "Hello", "max_tokens": 2, "stream": stream})
    assert status == 400 and "`stream`" in body["error"] and "generate_stream" in body["error"]
    assert http_generate(server, {"text_input": "Hello", "max_tokens": 2})[0] == 200
