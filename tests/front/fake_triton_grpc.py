"""A gRPC server speaking Triton's ModelStreamInfer like a decoupled LLM model, to test the real client
without tritonserver: token-per-response streaming, a final flag, errors as stream messages, cancellation."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tgi_llm.front import triton_io as io
from tgi_llm.triton.status import ERROR_CODE_PARAMETER, tag_error


def _bytes_raw(values: list[str]) -> bytes:
    return b"".join(struct.pack("<I", len(v.encode())) + v.encode() for v in values)


def _add(resp: service_pb2.ModelInferResponse, name: str, datatype: str, shape: list[int], raw: bytes) -> None:
    resp.outputs.add(name=name, datatype=datatype, shape=shape)
    resp.raw_output_contents.append(raw)


@dataclass
class FakeTritonServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    requests: list[service_pb2.ModelInferRequest] = field(default_factory=list)
    metadata: list[tuple[tuple[str, str], ...]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    final_alone: bool = False  # send the final flag in an empty response of its own

    async def ModelReady(self, request, context):  # noqa: N802 (gRPC's name)
        return service_pb2.ModelReadyResponse(ready=request.name == "tgi_llm")

    async def ModelStreamInfer(self, request_iterator, context):  # noqa: N802
        request = await request_iterator.__anext__()
        self.requests.append(request)
        self.metadata.append(tuple(context.invocation_metadata() or ()))
        prompt = request.inputs[0].contents.bytes_contents[0].decode()
        params = request.parameters
        n = params["max_new_tokens"].int64_param if "max_new_tokens" in params else 3
        try:
            if prompt.startswith("invalid"):  # "invalid <code>": the model's error with that code, tagged if asked
                message, code = "`top_n_tokens` must be >= 0 and <= 5", (prompt.split() + ["INVALID_ARG"])[1]
                if params[ERROR_CODE_PARAMETER].bool_param:
                    message = tag_error(message, code)
                yield service_pb2.ModelStreamInferResponse(error_message=message)
                return
            for i in range(n):
                if prompt == "slow" and i == 1:
                    await asyncio.Event().wait()  # until cancelled
                last = i == n - 1
                resp = self._token(request, i, last, n)
                resp.parameters["triton_final_response"].bool_param = last and not self.final_alone
                yield service_pb2.ModelStreamInferResponse(infer_response=resp)
            if self.final_alone:
                resp = service_pb2.ModelInferResponse(model_name="tgi_llm", id=request.id)
                resp.parameters["triton_final_response"].bool_param = True
                yield service_pb2.ModelStreamInferResponse(infer_response=resp)
        except asyncio.CancelledError:
            self.cancelled.append(request.id)
            raise

    def _token(self, request, i: int, last: bool, n: int) -> service_pb2.ModelInferResponse:
        resp = service_pb2.ModelInferResponse(model_name="tgi_llm", id=request.id)
        _add(resp, io.TEXT, "BYTES", [1], _bytes_raw([f" t{i}"]))
        _add(resp, io.TOKEN_IDS, "INT64", [1], np.array([10 + i], np.int64).tobytes())
        _add(resp, io.TOKEN_TEXTS, "BYTES", [1], _bytes_raw([f" t{i}"]))
        _add(resp, io.TOKEN_LOGPROBS, "FP32", [1], np.array([-0.5], np.float32).tobytes())
        if last:
            _add(resp, io.FINISH_REASON, "BYTES", [1], _bytes_raw(["length"]))
            _add(resp, io.NUM_INPUT, "INT32", [1], np.array([4], np.int32).tobytes())
            _add(resp, io.NUM_OUTPUT, "INT32", [1], np.array([n], np.int32).tobytes())
        return resp


async def start_fake_triton() -> tuple[grpc.aio.Server, FakeTritonServicer, str]:
    server = grpc.aio.server()
    servicer = FakeTritonServicer()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, servicer, f"127.0.0.1:{port}"
