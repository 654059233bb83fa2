"""The gRPC side of the gateway: Triton's GRPCInferenceService, forwarded as raw bytes.

Messages are not decoded (a stream costs one copy per response), with three exceptions that need no
decoding either: a request message over --payload-limit is refused by gRPC itself (RESOURCE_EXHAUSTED);
the admin methods (model repository, shared memory, trace, logging) answer PERMISSION_DENIED; and a
client's `authorization` metadata is handed to Triton as the header its restricted-API check reads.
Errors get the codes clients expect (statuses.py), in-stream errors a status when the client asked for
one with `triton_grpc_error: true`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from tgi_llm.gateway.statuses import grpc_error, in_stream_error

logger = logging.getLogger("tgi_llm.gateway")

SERVICE = "/inference.GRPCInferenceService/"
STREAM_METHOD = "ModelStreamInfer"
UNARY_METHODS = {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
                 "ModelConfig", "ModelStatistics"}
ADMIN_METHODS = {"RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryStatus",
                 "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus",
                 "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings"}
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
CLOSED_MESSAGE = "Triton's model-repository, shared-memory, trace and logging APIs are not served to clients"

#: Triton's restricted-API check on gRPC reads `triton-grpc-protocol-<header>`.
_TRITON_AUTH = "triton-grpc-protocol-authorization"
_DROPPED = {"user-agent", "content-type", "te", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout"}
#: ModelStreamInferResponse serializes `string error_message = 1` first: this tag byte means an error.
_ERROR_TAG = b"\x0a"


def upstream_metadata(metadata: Any) -> tuple[tuple[str, str], ...]:
    out = []
    for key, value in metadata or ():
        key = key.lower()
        if key.startswith(":") or key in _DROPPED or key.endswith("-bin"):
            continue
        out.append((_TRITON_AUTH if key == "authorization" else key, value))
    return tuple(out)


def _timeout(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e8 else None


class GrpcGateway(grpc.GenericRpcHandler):
    def __init__(self, upstream: str, model: str, max_message: int) -> None:
        self.model = model
        self.channel = grpc.aio.insecure_channel(upstream, options=[
            ("grpc.max_send_message_length", max_message), ("grpc.max_receive_message_length", -1),
        ])

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method == HEALTH_CHECK:
            return grpc.unary_unary_rpc_method_handler(self._unary(method))
        if not method.startswith(SERVICE):
            return None
        name = method[len(SERVICE):]
        if name == STREAM_METHOD:
            return grpc.stream_stream_rpc_method_handler(self._stream)
        if name in UNARY_METHODS:
            return grpc.unary_unary_rpc_method_handler(self._unary(method))
        if name in ADMIN_METHODS:
            return grpc.unary_unary_rpc_method_handler(self._closed)
        return None

    async def close(self) -> None:
        await self.channel.close()

    @staticmethod
    async def _closed(_request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, CLOSED_MESSAGE)
        return b""

    def _unary(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        call = self.channel.unary_unary(method)

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            try:
                return await call(request, metadata=upstream_metadata(context.invocation_metadata()),
                                  timeout=_timeout(context))
            except grpc.aio.AioRpcError as exc:
                code, message = grpc_error(exc.code(), exc.details() or "", self.model)
                await context.abort(code, message)
            return b""

        return forward

    async def _stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        metadata = upstream_metadata(context.invocation_metadata())
        wants_status = any(k == "triton_grpc_error" and v.lower() == "true" for k, v in metadata)
        call = self.channel.stream_stream(SERVICE + STREAM_METHOD)(requests, metadata=metadata,
                                                                   timeout=_timeout(context))
        try:
            async for response in call:
                if wants_status and response[:1] == _ERROR_TAG:
                    message = service_pb2.ModelStreamInferResponse.FromString(response).error_message
                    code, message = in_stream_error(message, self.model)
                    await context.abort(code, message)
                yield response
        except grpc.aio.AioRpcError as exc:
            code, message = grpc_error(exc.code(), exc.details() or "", self.model)
            await context.abort(code, message)
        finally:
            call.cancel()  # the client went away or the stream ended: Triton cancels what is left
