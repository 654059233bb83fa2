"""The HTTP side of the gateway: Triton's HTTP API and its metrics, forwarded from the public ports.

Only an allowlist is forwarded: health, metadata, config and statistics (GET), and infer / generate /
generate_stream (POST). Triton's model-repository, shared-memory, trace and logging APIs answer 403
here whatever the headers (tritonserver also wants the launcher's secret for them). Bodies are bounded
(BodyLimit), JSON is parsed with a depth cap and generate bodies are type-checked before Triton sees
them; compressed bodies are refused (Triton would inflate them past any limit). A client that goes
away cancels its generation: a streamed one when its upstream request is closed, a non-streamed generate
when its gRPC call is (it goes over gRPC for that: generate_grpc.py). An error of the gateway itself is one
log line and a 500 JSON answer (unhandled.py), never a request left hanging.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import grpc
import httpx
from starlette.types import ASGIApp, Receive, Scope, Send
from tritonclient.grpc import service_pb2

from tgi_llm.gateway.api_key import TRITON_GRPC_AUTHORIZATION, UNAUTHORIZED, ApiKey
from tgi_llm.gateway.body import BadJson, PayloadTooLarge, load_json
from tgi_llm.gateway.disconnect import until_disconnect
from tgi_llm.gateway.generate_body import BadBody, check_generate_body
from tgi_llm.gateway.generate_grpc import streams, to_json, to_request, wants_single_response
from tgi_llm.gateway.statuses import grpc_error, http_error, unavailable_message
from tgi_llm.gateway.unhandled import UnhandledErrors

logger = logging.getLogger("tgi_llm.gateway")

_MODEL = r"/v2/models/(?P<model>[^/]+)(?:/versions/[^/]+)?"
HEALTH_ROUTES = re.compile(rf"^(?:/v2/health/(?:live|ready)|{_MODEL}/ready)$")  # open with --api-key too
READ_ROUTES = re.compile(rf"^(?:/v2|/v2/health/(?:live|ready)|/v2/models/stats|{_MODEL}(?:/ready|/config|/stats)?)$")
INFER_ROUTES = re.compile(rf"^{_MODEL}/(?P<action>infer|generate|generate_stream)$")
ADMIN_ROUTES = re.compile(
    rf"^/v2/(?:repository|systemsharedmemory|cudasharedmemory|trace|logging)(?:/|$)|^{_MODEL}/trace(?:/|$)"
)
CLOSED_MESSAGE = "Triton's model-repository, shared-memory, trace and logging APIs are not served to clients"
DECOUPLED_MESSAGE = ("infer does not serve this model: it is decoupled (one request, many responses); use "
                     "generate / generate_stream, or gRPC ModelStreamInfer")

#: Not forwarded: hop-by-hop headers, the length (recomputed), encodings (bodies go plain both ways).
_REQUEST_HEADERS_DROPPED = {
    b"host", b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer",
    b"upgrade", b"content-length", b"accept-encoding", b"expect",
}
_RESPONSE_HEADERS_DROPPED = {"connection", "keep-alive", "transfer-encoding", "trailer", "upgrade"}
_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
#: HTTP status for a gRPC status of tritonserver's; any other is a refused request, as Triton's HTTP answers.
_HTTP_STATUS = {grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.INTERNAL: 500}


async def send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    await send_body(send, status, b"application/json", json.dumps(body).encode())


async def send_body(send: Send, status: int, content_type: bytes, payload: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def json_app(status: int, body: dict[str, Any]) -> ASGIApp:
    """An ASGI app that answers `body` with `status`."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, status, body)

    return app


def too_large_app(exc: PayloadTooLarge) -> ASGIApp:
    return json_app(413, {"error": str(exc)})


def _internal_error(_scope: Scope, exc: Exception) -> ASGIApp:
    return json_app(500, {"error": f"Internal error in the gateway: {type(exc).__name__}: {exc}"})


def _report_error(scope: Scope, exc: Exception) -> None:
    logger.error("gateway error on %s %s: %s: %s", scope["method"], scope["path"], type(exc).__name__, exc)


async def read_body(receive: Receive) -> bytes | None:
    """The whole body (BodyLimit bounds it), or None if the client went away first."""
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value
    return None


class GatewayApp:
    """ASGI app serving the public HTTP port (Triton's API) and the public metrics port."""

    def __init__(self, triton_http_url: str, triton_grpc_url: str, triton_metrics_url: str, model: str,
                 metrics_port: int | None, api_key: ApiKey | None = None) -> None:
        self.api_key = api_key or ApiKey(None)
        self.triton_http_url = triton_http_url.rstrip("/")
        self.triton_metrics_url = triton_metrics_url
        self.model = model
        self.metrics_port = metrics_port
        # No idle connections kept to tritonserver: on SIGTERM it waits for every open HTTP connection to
        # close (up to --graceful-termination-timeout), so one kept alive here would hold up every stop.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=5.0, read=None, write=30.0, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        )
        self._upstream_down = False
        self.channel = grpc.aio.insecure_channel(triton_grpc_url, options=[("grpc.max_receive_message_length", -1)])
        self._http = UnhandledErrors(self._serve, _internal_error, _report_error)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if server is not None and server[1] == self.metrics_port:
            await self._metrics(scope, send)
        else:
            await self._triton(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.client.aclose()
                await self.channel.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _metrics(self, scope: Scope, send: Send) -> None:
        if scope["path"] != "/metrics":
            await send_json(send, 404, {"error": "Not found: the metrics port serves GET /metrics"})
        elif scope["method"] not in ("GET", "HEAD"):
            await send_json(send, 405, {"error": "Method not allowed: the metrics port serves GET /metrics"})
        else:
            await self._forward(scope, None, send, self.triton_metrics_url)

    async def _triton(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        if ADMIN_ROUTES.match(path):
            await send_json(send, 403, {"error": CLOSED_MESSAGE})
            return
        if not HEALTH_ROUTES.match(path) and not self.api_key.allows(_header(scope, b"authorization")):
            await send_json(send, 401, {"error": UNAUTHORIZED})
            return
        encoding = (_header(scope, b"content-encoding") or b"identity").strip().lower()
        if encoding != b"identity":
            await send_json(send, 415, {"error": "Compressed request bodies are not accepted (Content-Encoding)"})
            return
        infer = INFER_ROUTES.match(path)
        if method in ("GET", "HEAD") and READ_ROUTES.match(path):
            await self._forward(scope, receive, send, self.triton_http_url + path)
        elif method == "POST" and infer is not None:
            body = await read_body(receive)
            if body is None:
                return
            try:
                parsed = self._check(scope, infer, body)
            except (BadJson, BadBody) as exc:
                await send_json(send, 400, {"error": str(exc)})
                return
            if parsed is not None and wants_single_response(infer["action"], parsed):
                await self._single_response(scope, receive, send, infer["action"], parsed)
            else:
                await self._forward(scope, receive, send, self.triton_http_url + path, body)
        elif READ_ROUTES.match(path) or infer is not None:
            await send_json(send, 405, {"error": f"Method {method} not allowed on {path}"})
        else:
            await send_json(send, 404, {"error": f"Not found: {path}"})

    def _check(self, scope: Scope, infer: re.Match, body: bytes) -> dict[str, Any] | None:
        """Raise BadJson / BadBody for a body Triton must not see; the parsed body of a generate for our model."""
        if infer["action"] == "infer" and infer["model"] == self.model:
            raise BadBody(DECOUPLED_MESSAGE)  # tritonserver refuses it too, but only after taking it in
        if infer["action"] == "infer":
            # The binary tensor extension: a JSON header of this many bytes, then raw tensor bytes.
            header = _header(scope, b"inference-header-content-length")
            json_part = body[: int(header)] if header is not None and header.isdigit() else body
            load_json(json_part)
            return None
        parsed = load_json(body)
        if infer["model"] != self.model:
            return None
        check_generate_body(parsed)
        if infer["action"] == "generate" and streams(parsed):  # Triton would answer 200 with an error body
            raise BadBody("`stream`: true sends a response per token, which `generate` cannot answer: use "
                          "generate_stream")
        return parsed

    async def _single_response(self, scope: Scope, receive: Receive, send: Send, action: str,
                               body: dict[str, Any]) -> None:
        """A non-streamed generate over tritonserver's gRPC stream, cancelled there if the client goes away first;
        answered as Triton's HTTP answers it (generate_stream: one server-sent event), errors as _forward does."""
        authorization = _header(scope, b"authorization")
        metadata = () if authorization is None else (
            (TRITON_GRPC_AUTHORIZATION, self.api_key.upstream(authorization.decode("latin-1"))),)
        done = await until_disconnect(receive, self._infer_over_grpc(to_request(body, self.model), metadata))
        if done.cancelled():
            return
        status, answer = done.result()
        if status != 200:  # a JSON error, as _send_error answers Triton's (generate_stream's too)
            await send_json(send, status, answer)
            return
        payload = json.dumps(answer, separators=(",", ":"), sort_keys=True).encode()
        if action == "generate":
            await send_body(send, status, b"application/json", payload)
        else:
            await send_body(send, status, b"text/event-stream; charset=utf-8", b"data: " + payload + b"\n\n")

    async def _infer_over_grpc(self, request: service_pb2.ModelInferRequest,
                               metadata: tuple[tuple[str, str], ...]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON answer) for one request on its own gRPC stream; cancelling this cancels the call."""
        call = self.channel.stream_stream(_STREAM_INFER)(iter([request.SerializeToString()]), metadata=metadata)
        try:
            # The stream holds one request, so tritonserver ends it after the request's response: read to that end.
            # Cancelled right after its response instead, tritonserver held the model at its next stop (exit 1, no
            # finalize), as it does for a refused request (infer_request.py).
            responses = [raw async for raw in call]
        except asyncio.CancelledError:
            call.cancel()  # the client went away: tritonserver cancels the request, its KV blocks come back
            raise
        except grpc.aio.AioRpcError as exc:
            code, message = grpc_error(exc.code(), exc.details() or "", self.model)
            status, message = http_error(_HTTP_STATUS.get(code, 400), message, self.model)
            return status, {"error": message}
        if not responses:
            return 500, {"error": "tritonserver ended the request without a response"}
        response = service_pb2.ModelStreamInferResponse.FromString(responses[0])
        if response.error_message:  # refused by the model: Triton's HTTP answers 400
            status, message = http_error(400, response.error_message, self.model)
            return status, {"error": message}
        return 200, to_json(response.infer_response)

    async def _forward(self, scope: Scope, receive: Receive | None, send: Send, url: str,
                       body: bytes | None = None) -> None:
        headers = [(k, self.api_key.upstream(v.decode("latin-1")).encode("latin-1") if k == b"authorization" else v)
                   for k, v in scope.get("headers", []) if k not in _REQUEST_HEADERS_DROPPED]
        query = scope.get("query_string", b"")
        request = self.client.build_request(scope["method"], url + ("?" + query.decode("latin-1") if query else ""),
                                            headers=headers, content=body)
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            if not self._upstream_down:  # once per outage (tritonserver starting or restarting)
                logger.warning("tritonserver does not answer (%s): answering 503", exc or type(exc).__name__)
            self._upstream_down = True
            await send_json(send, 503, {"error": unavailable_message(self.model)})
            return
        if self._upstream_down:
            logger.info("tritonserver answers again")
            self._upstream_down = False
        try:
            if response.status_code >= 400:
                await self._send_error(response, send)
            elif receive is None:
                await self._pump(response, send)
            else:
                pumped = await until_disconnect(receive, self._pump(response, send))
                if not pumped.cancelled():
                    pumped.result()  # its error, if any
        finally:
            await response.aclose()  # unread: the connection closes, and Triton cancels the request

    async def _send_error(self, response: httpx.Response, send: Send) -> None:
        raw = await response.aread()
        try:
            message = str(json.loads(raw).get("error", ""))
        except (ValueError, AttributeError):
            message = raw.decode("utf-8", errors="replace")
        status, message = http_error(response.status_code, message, self.model)
        await send_json(send, status, {"error": message})

    async def _pump(self, response: httpx.Response, send: Send) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.multi_items()
                   if k.lower() not in _RESPONSE_HEADERS_DROPPED]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        try:
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:  # tritonserver went away mid-response
            logger.warning("tritonserver stopped answering mid-response: %s", exc or type(exc))
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                return  # an incomplete response: uvicorn closes the connection, the client sees it cut
            # A stream ends as Triton ends one on error: an error event, then the end of the stream.
            event = json.dumps({"error": unavailable_message(self.model)})
            await send({"type": "http.response.body", "body": f"data: {event}\n\n".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
