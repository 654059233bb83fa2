"""An error of the gateway itself ends its request with an error status and one log line: never a call left
waiting (a gRPC stream whose reader task died) nor a traceback with uvicorn's plain-text 500."""

from __future__ import annotations

import asyncio
import json
import logging

import grpc
import pytest
from tritonclient.grpc import service_pb2

from tgi_llm.gateway import grpc_proxy, http_proxy
from tgi_llm.gateway.grpc_proxy import SERVICE, STREAM_METHOD, GrpcGateway
from tgi_llm.gateway.http_proxy import GatewayApp


def _broken(*_args, **_kwargs):
    raise RuntimeError("boom")


def _one_request() -> bytes:
    request = service_pb2.ModelInferRequest(model_name="tgi_llm")
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"Hi")
    return request.SerializeToString()


@pytest.mark.parametrize("status_header", [True, False])
def test_a_failing_stream_reader_ends_the_grpc_stream_with_internal(monkeypatch, caplog, status_header):
    monkeypatch.setattr(grpc_proxy, "check_request", _broken)

    async def run() -> grpc.aio.AioRpcError:
        server = grpc.aio.server()
        gateway = GrpcGateway("127.0.0.1:1", "tgi_llm", 1 << 20)  # tritonserver is never reached
        server.add_generic_rpc_handlers((gateway,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.stream_stream(SERVICE + STREAM_METHOD)(
                    iter([_one_request()]), metadata=(("triton_grpc_error", "true"),) if status_header else (),
                    timeout=20)  # hang guard
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for _ in call:
                        pass
                return info.value
        finally:
            await server.stop(0)
            await gateway.close()

    with caplog.at_level(logging.ERROR, logger="tgi_llm.gateway"):
        error = asyncio.run(run())
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "RuntimeError: boom" in error.details()
    records = [r for r in caplog.records if r.name == "tgi_llm.gateway"]
    assert [r.getMessage() for r in records] == ["gateway error in ModelStreamInfer: RuntimeError: boom"]
    assert records[0].exc_info is None


def test_a_failing_http_request_gets_a_500_json_answer_and_one_log_line(monkeypatch, caplog):
    monkeypatch.setattr(http_proxy, "check_generate_body", _broken)
    body = json.dumps({"text_input": "Hi"}).encode()
    scope = {"type": "http", "method": "POST", "path": "/v2/models/tgi_llm/generate", "headers": [],
             "query_string": b"", "server": ("127.0.0.1", 8000)}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    async def run() -> None:
        app = GatewayApp("http://127.0.0.1:1", "127.0.0.1:1", "http://127.0.0.1:1/metrics", "tgi_llm", None)
        await app(scope, receive, send)
        await app.channel.close()

    with caplog.at_level(logging.ERROR, logger="tgi_llm.gateway"):
        asyncio.run(run())
    assert sent[0]["status"] == 500
    assert json.loads(sent[1]["body"]) == {"error": "Internal error in the gateway: RuntimeError: boom"}
    records = [r for r in caplog.records if r.name == "tgi_llm.gateway"]
    assert [r.getMessage() for r in records] == [f"gateway error on POST {scope['path']}: RuntimeError: boom"]
    assert records[0].exc_info is None
