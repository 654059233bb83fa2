"""The gRPC side of the gateway: Triton's GRPCInferenceService, forwarded as raw bytes.

Responses are not decoded (a stream costs one copy per response). Requests for our model are decoded
once and checked against its inputs (infer_request.py), since tritonserver must not see those it would
refuse. A request message over --payload-limit is refused by gRPC itself (RESOURCE_EXHAUSTED); the
admin methods (model repository, shared memory, trace, logging) answer PERMISSION_DENIED. With --api-key,
every method but health wants `authorization: Bearer <key>` (api_key.py), which is also handed to Triton
as the header its restricted-API check reads. Errors get
the codes clients expect (statuses.py), in-stream errors a status when the client asked for one with
`triton_grpc_error: true`. That header is not passed on: tritonserver's handling of it crashes the server
(triton/status.py). The gateway asks the model for each error's code with a request parameter instead, and
gives the client the status (or, without the header, the error message untagged) itself. Any other error
in the gateway ends the call with INTERNAL and one log line (`internal_error`), never a call left waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from tgi_llm.gateway.api_key import TRITON_GRPC_AUTHORIZATION, UNAUTHORIZED, ApiKey
from tgi_llm.gateway.infer_request import BadRequest, check_request, error_response, parse, widen_int32
from tgi_llm.gateway.statuses import grpc_error, in_stream_error, model_error
from tgi_llm.triton.status import ERROR_CODE_PARAMETER, split_error_tag

logger = logging.getLogger("tgi_llm.gateway")

SERVICE = "/inference.GRPCInferenceService/"
STREAM_METHOD = "ModelStreamInfer"
HEALTH_METHODS = {"ServerLive", "ServerReady", "ModelReady"}  # open with --api-key too, for load balancers
UNARY_METHODS = HEALTH_METHODS | {"ServerMetadata", "ModelMetadata", "ModelConfig", "ModelStatistics"}
ADMIN_METHODS = {"RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryStatus",
                 "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus",
                 "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings"}
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
CLOSED_MESSAGE = "Triton's model-repository, shared-memory, trace and logging APIs are not served to clients"
DECOUPLED_MESSAGE = ("ModelInfer does not serve this model: it is decoupled (one request, many responses); use "
                     "ModelStreamInfer, or HTTP generate / generate_stream")
#: How long an ending stream waits for tritonserver to finish its side before cancelling it.
DRAIN_S = 5.0

#: The client's ask for statuses on stream errors: answered here, never passed on (see above).
_STATUS_HEADER = "triton_grpc_error"
_DROPPED = {"user-agent", "content-type", "te", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout",
            _STATUS_HEADER}
#: ModelStreamInferResponse serializes `string error_message = 1` first: this tag byte means an error.
_ERROR_TAG = b"\x0a"
#: Appended to a request's bytes, this sets one more request parameter (protobuf merges a repeated message).
_ASK_ERROR_CODE = service_pb2.ModelInferRequest(
    parameters={ERROR_CODE_PARAMETER: service_pb2.InferParameter(bool_param=True)}).SerializeToString()


def upstream_metadata(metadata: Any, api_key: ApiKey | None = None) -> tuple[tuple[str, str], ...]:
    out = []
    for key, value in metadata or ():
        key = key.lower()
        if key.startswith(":") or key in _DROPPED or key.endswith("-bin"):
            continue
        if key == "authorization":
            key, value = TRITON_GRPC_AUTHORIZATION, (api_key or ApiKey(None)).upstream(value)
        out.append((key, value))
    return tuple(out)


async def internal_error(context: grpc.aio.ServicerContext, method: str, exc: Exception) -> None:
    """End the call with INTERNAL for an error of the gateway itself: one log line, and a status the client
    can act on, where the failed task would otherwise leave the call waiting forever."""
    logger.error("gateway error in %s: %s: %s", method, type(exc).__name__, exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"Internal error in the gateway: {type(exc).__name__}: {exc}")


def _unary_errors(method: str, handler: Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]
                  ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    async def guarded(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            return await handler(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await internal_error(context, method, exc)
            return b""

    return guarded


def _timeout(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e8 else None


class GrpcGateway(grpc.GenericRpcHandler):
    def __init__(self, upstream: str, model: str, max_message: int, api_key: ApiKey | None = None) -> None:
        self.model = model
        self.api_key = api_key or ApiKey(None)
        self.channel = grpc.aio.insecure_channel(upstream, options=[
            ("grpc.max_send_message_length", max_message), ("grpc.max_receive_message_length", -1),
        ])

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method == HEALTH_CHECK:
            return grpc.unary_unary_rpc_method_handler(_unary_errors(method, self._unary(method)))
        if not method.startswith(SERVICE):
            return None
        name = method[len(SERVICE):]
        if name not in HEALTH_METHODS and not self._authorized(details.invocation_metadata):
            if name == STREAM_METHOD:
                return grpc.stream_stream_rpc_method_handler(self._unauthenticated_stream)
            return grpc.unary_unary_rpc_method_handler(self._unauthenticated)
        if name == STREAM_METHOD:
            return grpc.stream_stream_rpc_method_handler(self._stream)
        if name == "ModelInfer":
            return grpc.unary_unary_rpc_method_handler(_unary_errors(name, self._infer))
        if name in UNARY_METHODS:
            return grpc.unary_unary_rpc_method_handler(_unary_errors(name, self._unary(method)))
        if name in ADMIN_METHODS:
            return grpc.unary_unary_rpc_method_handler(self._closed)
        return None

    async def close(self) -> None:
        await self.channel.close()

    def _authorized(self, metadata: Any) -> bool:
        values = [value for key, value in metadata or () if key.lower() == "authorization"]
        return self.api_key.allows(values[0] if len(values) == 1 else None)

    @staticmethod
    async def _unauthenticated(_request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED)
        return b""

    @staticmethod
    async def _unauthenticated_stream(_requests: AsyncIterator[bytes],
                                      context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED)
        yield b""  # never reached: makes this an async generator, as stream handlers are

    @staticmethod
    async def _closed(_request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, CLOSED_MESSAGE)
        return b""

    def _unary(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        call = self.channel.unary_unary(method)

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            try:
                return await call(request, metadata=upstream_metadata(context.invocation_metadata(), self.api_key),
                                  timeout=_timeout(context))
            except grpc.aio.AioRpcError as exc:
                code, message = grpc_error(exc.code(), exc.details() or "", self.model)
                await context.abort(code, message)
            return b""

        return forward

    def _admit(self, raw: bytes) -> tuple[bytes, None] | tuple[None, tuple[str, str]]:
        """(the bytes for tritonserver, None), or (None, (message, request id)) for a request for our model
        that tritonserver would refuse. Requests for our model ask for their errors' codes, their INT32 token
        ids widened to INT64."""
        try:
            request = parse(raw)
        except BadRequest as exc:
            return None, (str(exc), "")
        if request.model_name != self.model:
            return raw, None
        try:
            check_request(request)
        except BadRequest as exc:
            return None, (str(exc), request.id)
        if widen_int32(request):
            raw = request.SerializeToString()
        return raw + _ASK_ERROR_CODE, None

    async def _infer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            model = parse(request).model_name
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if model == self.model:  # tritonserver refuses it too, but only after taking it in (see infer_request.py)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, DECOUPLED_MESSAGE)
        return await self._unary(SERVICE + "ModelInfer")(request, context)

    async def _stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Client requests go to tritonserver through a queue, those it would refuse are answered here;
        its responses and those answers reach the client through another."""
        wants_status = any(k.lower() == _STATUS_HEADER and v.lower() == "true"
                           for k, v in context.invocation_metadata() or ())
        metadata = upstream_metadata(context.invocation_metadata(), self.api_key)
        to_triton: asyncio.Queue[bytes | None] = asyncio.Queue()
        to_client: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

        async def triton_requests() -> AsyncIterator[bytes]:
            while (item := await to_triton.get()) is not None:
                yield item

        async def read_client() -> None:
            try:
                async for raw in requests:
                    forward, refusal = self._admit(raw)
                    if forward is not None:
                        to_triton.put_nowait(forward)
                    else:
                        to_client.put_nowait(("refused", *refusal))
                        if wants_status:
                            return  # the stream ends with that status
            finally:
                to_triton.put_nowait(None)  # half-close: tritonserver ends the stream once its requests are done

        async def read_triton() -> None:
            try:
                async for response in call:
                    to_client.put_nowait(("response", response))
                to_client.put_nowait(("end",))
            except grpc.aio.AioRpcError as exc:
                to_client.put_nowait(("failed", exc))

        async def reporting(read: Callable[[], Awaitable[None]]) -> None:
            """Run a reader; its error reaches the loop below, which ends the call (a task's error is
            otherwise seen by no one, and the client waits forever)."""
            try:
                await read()
            except Exception as exc:
                to_client.put_nowait(("crashed", exc))

        call = self.channel.stream_stream(SERVICE + STREAM_METHOD)(triton_requests(), metadata=metadata,
                                                                   timeout=_timeout(context))
        client_task = asyncio.ensure_future(reporting(read_client))
        triton_task = asyncio.ensure_future(reporting(read_triton))
        try:
            while True:
                item = await to_client.get()
                if item[0] == "response":
                    response = item[1]
                    if response[:1] == _ERROR_TAG:
                        error = service_pb2.ModelStreamInferResponse.FromString(response)
                        code, message = split_error_tag(error.error_message)
                        if wants_status:
                            # End tritonserver's side gracefully first: cancelling a stream that holds a request
                            # it refused leaks the model (infer_request.py).
                            client_task.cancel()
                            with contextlib.suppress(asyncio.TimeoutError):
                                await asyncio.wait_for(triton_task, DRAIN_S)
                            await context.abort(*(in_stream_error(message, self.model) if code is None
                                                  else model_error(code, message, self.model)))
                        if code is not None:
                            error.error_message = message
                            response = error.SerializeToString()
                    yield response
                elif item[0] == "refused":
                    if wants_status:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, item[1])
                    yield error_response(item[1], item[2])
                elif item[0] == "end":
                    return
                elif item[0] == "failed":
                    exc = item[1]
                    await context.abort(*grpc_error(exc.code(), exc.details() or "", self.model))
                else:
                    raise item[1]
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await internal_error(context, STREAM_METHOD, exc)
        finally:
            client_task.cancel()
            triton_task.cancel()
            call.cancel()  # the client went away or the stream ended: tritonserver cancels what is left
