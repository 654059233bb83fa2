"""Streaming clients: Triton gRPC (tritonclient), Triton HTTP generate_stream (httpx) and the engine
in-process (tgi_llm.LLM). Each fills the same RequestRecord: send time, one timestamp per token, end.

`start()` is called from the load driver's thread and must not block; `done(record)` is called once per
request from whatever thread saw its end. A client lives across runs (its connections stay open, as a
real client's would); `prepare(n)` opens what n requests in flight need before the clock starts.
Every request asks for greedy decoding of exactly `output_len` tokens (`ignore_eos`, a BOOL input of
the model), so every system does the same work.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from tgi_llm.bench.stats import RequestRecord
from tgi_llm.bench.workload import BenchRequest

Done = Callable[[RequestRecord], None]
MODEL = "tgi_llm"
RESPONSE_TIMEOUT_S = 600.0  # hang guard for one HTTP read


class StreamClient(Protocol):
    name: str

    def prepare(self, in_flight: int) -> None: ...

    def start(self, request: BenchRequest, record: RequestRecord, done: Done) -> None: ...

    def close(self, cancel: bool = False) -> None: ...


class _LoopThread:
    """One asyncio event loop on a daemon thread, on which every stream of a client runs. The benchmark
    shares the CPU with the server it measures, so its own cost per token matters: a thread and a gRPC
    channel per stream cost ~19% of a core at 250 tokens/s here, one loop and one channel ~3%."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._running: set[Future[None]] = set()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        """Run `coro` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def spawn_request(self, stream: Coroutine[Any, Any, None], record: RequestRecord, done: Done) -> None:
        """Run one request's `stream` (which fills `record`) on the loop; `done(record)` once it ends,
        whatever ends it, except a cancel: then the driver, which timed out, marks the request itself."""
        future = asyncio.run_coroutine_threadsafe(_guarded(stream, record, done), self.loop)
        self._running.add(future)
        future.add_done_callback(self._running.discard)

    def cancel_all(self) -> None:
        for future in list(self._running):
            future.cancel()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30.0)
        if not self._thread.is_alive():
            self.loop.close()


async def _guarded(stream: Coroutine[Any, Any, None], record: RequestRecord, done: Done) -> None:
    try:
        await stream
    except asyncio.CancelledError:
        return
    except Exception as exc:  # a broken stream or connection fails this request only
        record.error = f"{type(exc).__name__}: {exc}"
    if record.end is None:
        record.end = time.perf_counter()
    done(record)


class GrpcStreamClient:
    """Triton gRPC ModelStreamInfer (tritonclient's asyncio client): one channel, one stream per request
    (tritonclient reports a stream's errors without a request id, so a shared stream could not tell
    which request failed)."""

    def __init__(self, url: str, ignore_eos: bool = True, model: str = MODEL, name: str = "triton-grpc") -> None:
        self.name, self._url, self._model, self._ignore_eos = name, url, model, ignore_eos
        self._loop: _LoopThread | None = None
        self._client: Any = None

    def prepare(self, in_flight: int) -> None:
        if self._loop is None:
            self._loop = _LoopThread("bench-grpc")
            self._loop.call(self._connect())  # the channel connects now, not in the first timed request

    async def _connect(self) -> None:
        import tritonclient.grpc.aio as grpcaio  # the channel belongs to the loop it is created on

        self._client = grpcaio.InferenceServerClient(self._url)
        await self._client.is_server_live()

    def start(self, request: BenchRequest, record: RequestRecord, done: Done) -> None:
        self.prepare(1)
        inputs = self._inputs(request)
        record.start = time.perf_counter()
        self._loop.spawn_request(self._stream(request, inputs, record), record, done)

    async def _stream(self, request: BenchRequest, inputs: list[Any], record: RequestRecord) -> None:
        async def one_request() -> Any:
            yield {"model_name": self._model, "inputs": inputs, "request_id": str(request.index)}

        async for result, error in self._client.stream_infer(one_request()):
            now = time.perf_counter()  # first thing: the arrival time is what we measure
            if error is not None:
                record.error = str(error)
                return
            response = result.get_response()
            if any(o.name == "text_output" for o in response.outputs):
                _arrived(record, now, _first_int(result.as_numpy("num_output_tokens")))
                record.text += result.as_numpy("text_output").reshape(-1)[0].decode("utf-8", errors="replace")
            if response.parameters["triton_final_response"].bool_param:
                record.reported_output_tokens = _first_int(result.as_numpy("num_output_tokens"))
                record.reported_input_tokens = _first_int(result.as_numpy("num_input_tokens"))
                record.end = now
                return
        record.error = "stream ended without a final response"

    def _inputs(self, request: BenchRequest) -> list[Any]:
        import tritonclient.grpc as grpcclient

        values = [("text_input", np.array([request.prompt.encode()], dtype=np.object_), "BYTES"),
                  ("max_tokens", np.array([request.output_len], dtype=np.int32), "INT32"),
                  ("stream", np.array([True]), "BOOL"),
                  ("ignore_eos", np.array([self._ignore_eos]), "BOOL")]
        inputs = []
        for name, array, dtype in values:
            tensor = grpcclient.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return inputs

    def close(self, cancel: bool = False) -> None:
        if self._loop is None:
            return
        if cancel:
            self._loop.cancel_all()  # closes those streams: the server sees the requests cancelled
        self._loop.call(self._client.close())
        self._loop.stop()
        self._loop, self._client = None, None


class HttpStreamClient:
    """Triton's HTTP generate extension, `/v2/models/<model>/generate_stream` (server-sent events), through
    httpx's asyncio client on one loop thread (see _LoopThread): keep-alive connections, one per request
    in flight."""

    def __init__(self, url: str, max_in_flight: int, ignore_eos: bool = True, model: str = MODEL,
                 name: str = "triton-http") -> None:
        self.name, self._ignore_eos, self._max_in_flight = name, ignore_eos, max_in_flight
        self._url = f"{url.rstrip('/')}/v2/models/{model}/generate_stream"
        self._loop: _LoopThread | None = None
        self._http: Any = None

    def prepare(self, in_flight: int) -> None:
        if self._loop is None:
            self._loop = _LoopThread("bench-http")
            self._loop.call(self._open())

    async def _open(self) -> None:
        import httpx

        n = self._max_in_flight
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        self._http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(RESPONSE_TIMEOUT_S, connect=30.0))

    def start(self, request: BenchRequest, record: RequestRecord, done: Done) -> None:
        self.prepare(1)
        record.start = time.perf_counter()
        self._loop.spawn_request(self._stream(request, record), record, done)

    async def _stream(self, request: BenchRequest, record: RequestRecord) -> None:
        body = {"text_input": request.prompt, "max_tokens": request.output_len, "stream": True,
                "ignore_eos": self._ignore_eos}
        async with self._http.stream("POST", self._url, json=body, headers={"Accept": "text/event-stream"}) as r:
            if r.status_code != 200:
                record.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                now = time.perf_counter()
                event = json.loads(line[len("data:"):])
                if "error" in event:
                    record.error = str(event["error"])
                    return
                if "text_output" in event:
                    _arrived(record, now, _first_int(event.get("num_output_tokens")))
                    record.text += event["text_output"]
                if "finish_reason" in event:
                    record.reported_output_tokens = _first_int(event.get("num_output_tokens"))
                    record.reported_input_tokens = _first_int(event.get("num_input_tokens"))
                    record.end = now
        if record.end is None:
            record.error = "stream ended without a final response"

    def close(self, cancel: bool = False) -> None:
        if self._loop is None:
            return
        if cancel:
            self._loop.cancel_all()
        self._loop.call(self._http.aclose())
        self._loop.stop()
        self._loop, self._http = None, None


class EngineClient:
    """The engine called directly (tgi_llm.LLM.submit, streaming): timestamps are taken on the engine
    thread when it emits each event, i.e. without any transport."""

    def __init__(self, llm: Any, ignore_eos: bool = True, name: str = "engine") -> None:
        self.name, self._llm, self._ignore_eos = name, llm, ignore_eos
        self._handles: list[Any] = []

    def prepare(self, in_flight: int) -> None:
        pass

    def start(self, request: BenchRequest, record: RequestRecord, done: Done) -> None:
        from tgi_llm.errors import TgiError
        from tgi_llm.events import ErrorEvent, FinalEvent, TokenEvent

        def on_event(event: Any) -> None:
            now = time.perf_counter()
            if isinstance(event, TokenEvent):
                record.token_times.append(now)
                record.text += event.token.text
                return
            if isinstance(event, FinalEvent):
                record.reported_output_tokens = event.generated_tokens
                record.reported_input_tokens = event.input_tokens
            elif isinstance(event, ErrorEvent):
                record.error = str(event.error)
            record.end = now
            done(record)

        params = {"max_new_tokens": request.output_len, "ignore_eos": self._ignore_eos}
        record.start = time.perf_counter()
        try:
            self._handles.append(self._llm.submit(request.prompt, params, on_event, stream=True))
        except TgiError as exc:
            record.error, record.end = str(exc), time.perf_counter()
            done(record)

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for handle in self._handles:
                handle.cancel()  # a no-op for requests that already ended
        self._handles.clear()


def _arrived(record: RequestRecord, now: float, generated: int | None) -> None:
    """A streamed response: every token it carries (a step's several, with speculation) arrived now. The
    response says how many tokens were generated so far; a response without the count carries one."""
    count = generated - len(record.token_times) if generated is not None else 1
    record.token_times.extend([now] * max(count, 0))


def _first_int(value: Any) -> int | None:
    if value is None:
        return None
    flat = np.asarray(value).reshape(-1)
    return int(flat[0]) if flat.size else None
