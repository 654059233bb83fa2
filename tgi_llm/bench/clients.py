"""Streaming clients: Triton gRPC (tritonclient), Triton HTTP generate_stream (httpx) and the engine
in-process (tgi_llm.LLM). Each fills the same RequestRecord: send time, one timestamp per token, end.

`start()` is called from the load driver's thread and must not block; `done(record)` is called once per
request from whatever thread saw its end. A client lives across runs (its connections stay open, as a
real client's would); `prepare(n)` opens what n requests in flight need before the clock starts.
Every request asks for greedy decoding of exactly `output_len` tokens (`ignore_eos`, a BOOL input of
the model), so every system does the same work.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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


class _GrpcSlot:
    """One gRPC stream carrying one request at a time. Streams are not shared between in-flight requests
    because tritonclient's callback gets no request id with an error, so an error could not be placed."""

    def __init__(self, url: str, on_response: Callable[[_GrpcSlot, Any, Any], None]) -> None:
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(url)
        self.current: tuple[RequestRecord, Done] | None = None
        self.client.start_stream(callback=lambda result, error: on_response(self, result, error))


class GrpcStreamClient:
    """Triton gRPC ModelStreamInfer: a pool of streams, one per request in flight (grown on demand)."""

    def __init__(self, url: str, ignore_eos: bool = True, model: str = MODEL, name: str = "triton-grpc") -> None:
        self.name, self._url, self._model, self._ignore_eos = name, url, model, ignore_eos
        self._lock = threading.Lock()
        self._free: list[_GrpcSlot] = []
        self._all: list[_GrpcSlot] = []

    def prepare(self, in_flight: int) -> None:
        while len(self._all) < in_flight:
            slot = _GrpcSlot(self._url, self._on_response)
            slot.client.is_server_live()  # connects the channel now, not during the first timed request
            self._all.append(slot)
            with self._lock:
                self._free.append(slot)

    def start(self, request: BenchRequest, record: RequestRecord, done: Done) -> None:
        with self._lock:
            slot = self._free.pop() if self._free else None
        if slot is None:
            slot = _GrpcSlot(self._url, self._on_response)
            self._all.append(slot)
        slot.current = (record, done)
        inputs = self._inputs(request)
        record.start = time.perf_counter()
        try:
            slot.client.async_stream_infer(self._model, inputs, request_id=str(request.index))
        except Exception as exc:  # the stream died (server gone): this request fails, the slot is dropped
            slot.current = None
            self._all.remove(slot)
            record.error, record.end = f"{type(exc).__name__}: {exc}", time.perf_counter()
            done(record)

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

    def _on_response(self, slot: _GrpcSlot, result: Any, error: Any) -> None:
        now = time.perf_counter()  # first thing: the arrival time is what we measure
        if slot.current is None:
            return
        record, done = slot.current
        final = True
        if error is not None:
            record.error = str(error)
        else:
            response = result.get_response()
            if any(o.name == "text_output" for o in response.outputs):
                record.token_times.append(now)
            final = response.parameters["triton_final_response"].bool_param
            if final:
                record.reported_output_tokens = _first_int(result.as_numpy("num_output_tokens"))
                record.reported_input_tokens = _first_int(result.as_numpy("num_input_tokens"))
        if final:
            record.end = now
            slot.current = None
            with self._lock:
                self._free.append(slot)
            done(record)

    def close(self, cancel: bool = False) -> None:
        for slot in self._all:
            slot.client.stop_stream(cancel_requests=cancel)
            slot.client.close()
        self._all.clear()
        self._free.clear()


class HttpStreamClient:
    """Triton's HTTP generate extension, `/v2/models/<model>/generate_stream` (server-sent events):
    one thread and one connection per request in flight."""

    def __init__(self, url: str, max_in_flight: int, ignore_eos: bool = True, model: str = MODEL,
                 name: str = "triton-http") -> None:
        import httpx

        self.name, self._ignore_eos = name, ignore_eos
        self._url = f"{url.rstrip('/')}/v2/models/{model}/generate_stream"
        limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
        self._http = httpx.Client(limits=limits, timeout=httpx.Timeout(RESPONSE_TIMEOUT_S, connect=30.0))
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="bench-http")

    def prepare(self, in_flight: int) -> None:
        pass  # keep-alive connections open on the first requests (the warm-up) and stay in the pool

    def start(self, request: BenchRequest, record: RequestRecord, done: Done) -> None:
        self._pool.submit(self._run, request, record, done)

    def _run(self, request: BenchRequest, record: RequestRecord, done: Done) -> None:
        body = {"text_input": request.prompt, "max_tokens": request.output_len, "stream": True,
                "ignore_eos": self._ignore_eos}
        try:
            record.start = time.perf_counter()
            with self._http.stream("POST", self._url, json=body, headers={"Accept": "text/event-stream"}) as r:
                if r.status_code != 200:
                    record.error = f"HTTP {r.status_code}: {r.read()[:300]!r}"
                    return
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    now = time.perf_counter()
                    event = json.loads(line[len("data:"):])
                    if "error" in event:
                        record.error = str(event["error"])
                        return
                    if "text_output" in event:
                        record.token_times.append(now)
                    if "finish_reason" in event:
                        record.reported_output_tokens = _first_int(event.get("num_output_tokens"))
                        record.reported_input_tokens = _first_int(event.get("num_input_tokens"))
                        record.end = now
            if record.end is None and record.error is None:
                record.error = "stream ended without a final response"
        except Exception as exc:  # a broken connection fails this request only
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            if record.error is not None and record.end is None:
                record.end = time.perf_counter()
            done(record)

    def close(self, cancel: bool = False) -> None:
        if cancel:
            self._http.close()  # breaks the streams still open; their threads then end
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._http.close()


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


def _first_int(value: Any) -> int | None:
    if value is None:
        return None
    flat = np.asarray(value).reshape(-1)
    return int(flat[0]) if flat.size else None
