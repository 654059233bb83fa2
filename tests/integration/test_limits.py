"""No request crashes or stalls the server: bounded bodies and messages on every port, deep JSON, huge
prompts, slow clients, and errors that name the field."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from .conftest import REQUEST_READ_TIMEOUT_S
from .harness import MODEL, Launched, grpc_generate, http_generate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MB = 1_000_000


def raw_post(url: str, data: bytes, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def still_serving(server: Launched) -> bool:
    return server.ready() and http_generate(server, {"text_input": "Hello", "max_tokens": 2})[0] == 200


def test_bodies_over_the_payload_limit_get_413_on_every_http_port(server: Launched):
    big = json.dumps({"text_input": "hi", "max_tokens": 2, "junk": "x" * (8 * MB)}).encode()  # crashed Triton 2.51
    generate = f"{server.http}/v2/models/{MODEL}/generate"
    metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"
    for url in (generate, f"{server.http}/v2/health/ready", metrics):
        status, body = raw_post(url, big)
        assert status == 413, url
        assert body["error"] == "Payload too large: the request body must be at most 2000000 bytes (--payload-limit)"
    chunked = iter([big[i:i + MB] for i in range(0, len(big), MB)])  # no Content-Length: counted while read
    assert raw_post(generate, chunked, {"Transfer-Encoding": "chunked"})[0] == 413
    assert still_serving(server)


def test_deep_or_malformed_json_gets_400_naming_the_problem(server: Launched):
    generate = f"{server.http}/v2/models/{MODEL}/generate"
    deep = b'{"text_input": "hi", "junk": ' + b"[" * 500_000 + b"]" * 500_000 + b"}"  # 1 MB: crashed Triton 2.51
    assert raw_post(generate, deep) == (400, {"error": "JSON body nested deeper than 32 levels"})
    status, body = raw_post(generate, b'{"text_input": "hi", "max_tokens": 3')
    assert status == 400 and body["error"].startswith("the request body is not valid JSON")
    assert raw_post(generate, b'{"text_input": "hi", "max_tokens": "abc"}') == (
        400, {"error": "`max_tokens` must be an integer. Given: 'abc'"})
    assert raw_post(generate, b'{"text_input": "hi", "temperature": "x"}') == (
        400, {"error": "`temperature` must be a number. Given: 'x'"})
    assert raw_post(generate, b'{"text_input": "hi", "max_tokens": 2}', {"Content-Encoding": "gzip"})[0] == 415
    assert still_serving(server)


def test_grpc_messages_over_the_payload_limit_are_refused(server: Launched):
    reply = grpc_generate(server, "x" * (8 * MB), max_tokens=2)
    assert reply.error is not None and reply.error.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert still_serving(server)


def _stream_request(prompt: str) -> bytes:
    """A serialized ModelStreamInferRequest for `prompt` (built before timing: 50 MB takes a while)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=MODEL, id="big")
    tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(prompt.encode())
    return request.SerializeToString()


def _grpc_send(server: Launched, raw: bytes) -> tuple[str, str]:
    """Send one pre-serialized request on a stream; (status code, message) of how it ended."""
    import grpc

    with grpc.insecure_channel(server.grpc, options=[("grpc.max_send_message_length", -1)]) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")(
            iter([raw]), metadata=(("triton_grpc_error", "true"),), timeout=60)
        try:
            for _ in call:
                pass
        except grpc.RpcError as exc:
            return str(exc.code()), exc.details()
    return "OK", ""


def test_a_50_mb_prompt_is_refused_in_under_a_second_while_a_small_request_finishes(server: Launched):
    generate = f"{server.http}/v2/models/{MODEL}/generate"
    sends = {
        "grpc 50 MB": (_grpc_send, _stream_request("word " * (10 * MB))),
        "http 50 MB": (lambda _s, body: raw_post(generate, body),
                       json.dumps({"text_input": "word " * (10 * MB), "max_tokens": 2}).encode()),
        # Under the payload limit, so it reaches the model: refused from its length, without tokenizing.
        "grpc 1.9 MB": (_grpc_send, _stream_request("word " * 380_000)),
    }
    small: list = []
    thread = threading.Thread(target=lambda: small.append(grpc_generate(server, "Hello", max_tokens=16)))
    thread.start()
    outcomes, elapsed = {}, {}
    for name, (send, payload) in sends.items():
        start = time.monotonic()
        outcomes[name] = send(server, payload)
        elapsed[name] = time.monotonic() - start
    thread.join(300)
    assert outcomes["grpc 50 MB"][0] == "StatusCode.RESOURCE_EXHAUSTED"
    assert outcomes["http 50 MB"][0] == 413
    code, message = outcomes["grpc 1.9 MB"]
    assert code == "StatusCode.INVALID_ARGUMENT"
    assert message.startswith("`inputs` must have less than 512 tokens. Given: 1900000 characters")
    assert all(seconds < 1.0 for seconds in elapsed.values()), elapsed
    (reply,) = small
    assert reply.error is None and reply.finals[-1] is True and reply.num_output_tokens > 0


def test_a_client_that_never_finishes_its_request_is_disconnected(server: Launched):
    conns = []
    try:
        for i in range(20):
            conn = socket.create_connection(("127.0.0.1", server.http_port))
            if i % 2:
                conn.sendall(b"POST /v2/models/tgi_llm/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            else:
                conn.sendall(b"POST /v2/models/tgi_llm/generate HTTP/1.1\r\nHost: x\r\n")  # headers never end
            conns.append(conn)
        assert still_serving(server)  # meanwhile, others are served
        start = time.monotonic()
        for conn in conns:
            conn.settimeout(REQUEST_READ_TIMEOUT_S + 30)
            while conn.recv(4096):
                pass  # until the gateway closes it
        assert time.monotonic() - start < REQUEST_READ_TIMEOUT_S + 5
    finally:
        for conn in conns:
            conn.close()
