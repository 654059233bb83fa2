"""The front's Triton client: one gRPC ModelStreamInfer call per request, decoded into Chunks.

Built on tritonclient's generated gRPC stub (over grpc.aio) rather than InferenceServerClient.stream_infer,
because the stream must ask for Triton's empty final response (`triton_enable_empty_final_response`, a
reserved parameter the aio helper refuses; without it a model that sends its final flag alone would leave
the stream open forever). Errors arrive inside the stream, their code tagged in the message (not with the
`triton_grpc_error` header, whose handling crashes tritonserver: triton/status.py).
Cancelling the call is how Triton learns the client went away: the model sees the request cancelled and
frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc

from tgi_llm.front.errors import FrontError, from_triton
from tgi_llm.front.protocol import Chunk, GenerateSpec
from tgi_llm.front.triton_io import decode_response, encode_request, merge_final

_MAX_MESSAGE = 256 * 1024 * 1024


class TritonGrpcClient:
    def __init__(self, url: str, model_name: str = "tgi_llm", metrics_url: str | None = None,
                 api_key: str | None = None) -> None:
        self.url = url
        self.model_name = model_name
        self.metrics_url = metrics_url
        # With --api-key, tritonserver's restricted-API check wants the key: under the name it reads on
        # gRPC (tritonserver's own port), and the standard one (the gateway renames it).
        self._auth: tuple[tuple[str, str], ...] = (
            (("triton-grpc-protocol-authorization", f"Bearer {api_key}"), ("authorization", f"Bearer {api_key}"))
            if api_key else ()
        )
        self._channel: grpc.aio.Channel | None = None
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None

    def _service(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        # Created lazily, inside the server's event loop (grpc.aio binds a channel to the loop it starts in).
        if self._stub is None:
            options = [
                ("grpc.max_send_message_length", _MAX_MESSAGE),
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
                # tritonserver is on loopback, started beside the front and restarted after a model failure:
                # a reconnect is cheap, and gRPC's default backoff (up to 120 s) would keep the front
                # answering 503 long after the model is ready again.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ]
            self._channel = grpc.aio.insecure_channel(self.url, options=options)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

    async def stream(self, spec: GenerateSpec, request_id: str) -> AsyncIterator[Chunk]:
        request = encode_request(self.model_name, spec, request_id)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        finished = asyncio.Event()

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield request
            await finished.wait()  # half-closing early would end the stream before the last response

        call = self._service().ModelStreamInfer(requests(), metadata=self._auth)
        done = False
        pending: Chunk | None = None  # a last response whose final flag is still to come
        try:
            async for response in call:
                if response.error_message:
                    done = True
                    raise from_triton(response.error_message)
                flagged = _is_final(response.infer_response)
                chunk = decode_response(InferResult(response.infer_response), final=flagged)
                if pending is not None:
                    chunk = merge_final(pending, chunk)
                if chunk.final and not flagged:
                    pending = chunk  # read on to the flag, so the call ends cleanly before we hand it over
                    continue
                if chunk.final:
                    done = True
                yield chunk
                if done:
                    return
            if pending is not None:
                done = True
                yield pending
                return
            raise FrontError("Incomplete generation", "incomplete_generation")
        except grpc.aio.AioRpcError as exc:
            done = True
            raise from_triton(exc.details() or str(exc), str(exc.code())) from None
        finally:
            finished.set()
            if not done:
                call.cancel()  # synchronous: safe even inside a cancelled task's cleanup

    async def ready(self) -> bool:
        try:
            reply = await self._service().ModelReady(service_pb2.ModelReadyRequest(name=self.model_name), timeout=5,
                                                     metadata=self._auth)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.ready)

    async def model_config(self) -> Any:
        reply = await self._service().ModelConfig(service_pb2.ModelConfigRequest(name=self.model_name), timeout=10,
                                                  metadata=self._auth)
        return reply.config

    async def metrics(self) -> str:
        """Triton's Prometheus text (the model's tgi_* metrics are among them)."""
        if not self.metrics_url:
            return ""
        import httpx

        try:
            async with httpx.AsyncClient(timeout=5) as http:
                reply = await http.get(self.metrics_url)
            return reply.text
        except httpx.HTTPError:
            return ""

    async def close(self) -> None:
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()
            self._channel = None
            self._stub = None


def _is_final(response: service_pb2.ModelInferResponse) -> bool:
    param = response.parameters.get("triton_final_response")
    return bool(param.bool_param) if param is not None else False

