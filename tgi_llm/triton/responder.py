"""The responder thread: the only thread that talks back to Triton.

In the Python backend each `send`, `is_cancelled` and metric call is a blocking round trip to the
server process. The engine thread therefore only queues events (`callback`), and this thread sends
responses, polls cancellation for all live requests in one sweep every `poll_interval_s`, and
records metrics. Every request it is told about gets exactly one final response.

The poll interval (100 ms, `cancellation_poll_ms`) bounds what a cancelled request can still cost: about
two decode steps at batch 32 here. At 20 ms, 32 live requests made 1,600 round trips a second, CPU that
the server process and this one take from the forward on a small machine (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tgi_llm.engine.stats import EngineStats, StepStats
from tgi_llm.errors import GenerationError, ShutdownError
from tgi_llm.events import ErrorEvent, Event, FinalEvent, TokenEvent
from tgi_llm.triton.memory import IdleTrim
from tgi_llm.triton.metrics import TgiMetrics
from tgi_llm.triton.outputs import Outputs, final_outputs, token_outputs

logger = logging.getLogger(__name__)


class ResponseApi(Protocol):
    """What the responder needs from Triton (pb_utils in the stub, a fake in tests)."""

    def send(self, sender: Any, outputs: Outputs | None, error: BaseException | None, final: bool) -> None: ...

    def is_cancelled(self, sender: Any) -> bool: ...


@dataclass
class Live:
    """A request accepted by `execute`, from registration to its final response."""

    sender: Any  # the request's response sender
    stream: bool
    details: bool
    prefix: str = ""  # the prompt, sent before the first delta when return_full_text
    received_at: float = 0.0
    handle: Any = None  # engine RequestHandle, set once submit returned
    cancel_requested: bool = False


@dataclass(frozen=True)
class _Register:
    key: int
    live: Live


@dataclass(frozen=True)
class _Event:
    key: int
    event: Event


@dataclass(frozen=True)
class _Fail:
    key: int
    error: BaseException


@dataclass(frozen=True)
class _Answer:
    sender: Any
    outputs: Outputs


@dataclass(frozen=True)
class _Reject:
    sender: Any
    error: BaseException


_STOP = object()


class Responder:
    def __init__(self, api: ResponseApi, metrics: TgiMetrics | None = None,
                 engine_stats: Callable[[], EngineStats] | None = None,
                 drain_steps: Callable[[], list[StepStats]] | None = None,
                 poll_interval_s: float = 0.1, idle_trim: IdleTrim | None = None) -> None:
        self._api = api
        self._idle_trim = idle_trim
        self._metrics = metrics
        self._engine_stats = engine_stats
        self._drain_steps = drain_steps
        self._poll_interval_s = poll_interval_s
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._live: dict[int, Live] = {}
        self._held: dict[int, list[TokenEvent]] = {}
        self._thread: threading.Thread | None = None

    # ---- any thread ----
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tgi-responder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 60.0) -> None:
        """Send everything queued, end every request still live with an error, then exit."""
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def reject(self, sender: Any, error: BaseException) -> None:
        """A request that never reached the engine (invalid): its one response is this error."""
        self._queue.put(_Reject(sender, error))

    def answer(self, sender: Any, outputs: Outputs) -> None:
        """A request the model answers itself (LoRA admin): its one, final response."""
        self._queue.put(_Answer(sender, outputs))

    def register(self, key: int, live: Live) -> None:
        """Call before engine.submit, so the request is known before its first event."""
        self._queue.put(_Register(key, live))

    def fail(self, key: int, error: BaseException) -> None:
        """A registered request the engine refused (overloaded, shutting down)."""
        self._queue.put(_Fail(key, error))

    def callback(self, key: int) -> Callable[[Event], None]:
        """on_event for engine.submit: runs on the engine thread, so it only queues."""
        put = self._queue.put
        return lambda event: put(_Event(key, event))

    @property
    def live_count(self) -> int:
        return len(self._live)

    # ---- responder thread ----
    def _run(self) -> None:
        next_poll = time.monotonic()
        stopping = False
        while not stopping:
            items = self._take(max(0.0, next_poll - time.monotonic()))
            if _STOP in items:
                stopping = True
                items = items[: items.index(_STOP)]
            self._guard(self._handle, items)
            if stopping or time.monotonic() >= next_poll:
                self._guard(self._poll)
                next_poll = time.monotonic() + self._poll_interval_s
        for key in list(self._live):
            self._guard(self._finish_error, key, ShutdownError(), None)
        if self._metrics is not None:
            self._metrics.close()

    def _take(self, timeout: float | None) -> list[Any]:
        items: list[Any] = []
        if timeout is not None:
            try:
                items.append(self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait())
            except queue.Empty:
                return items
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items

    def _handle(self, items: list[Any]) -> None:
        # Each request's tokens of this batch (a step's, or several steps' when this thread fell behind)
        # go out as one response, with its final if one follows. A token flagged `last` waits for its
        # FinalEvent even across batches, so the final response always carries the last tokens.
        held = self._held
        for item in items:
            if isinstance(item, _Event):
                self._guard(self._on_event, item.key, item.event, held)
            elif isinstance(item, _Register):
                self._live[item.key] = item.live
                self._record(lambda m: m.request_received())
            elif isinstance(item, _Fail):
                self._guard(self._finish_error, item.key, item.error, None)
            elif isinstance(item, _Answer):
                self._guard(self._api.send, item.sender, item.outputs, None, True)
            elif isinstance(item, _Reject):
                self._record(lambda m: m.request_received())
                self._record(lambda m, e=item.error: m.request_failed(e))
                self._guard(self._api.send, item.sender, None, item.error, True)
        for key, events in list(held.items()):
            if not events[-1].last:
                del held[key]
                self._guard(self._send_tokens, key, events)

    def _on_event(self, key: int, event: Event, held: dict[int, list[TokenEvent]]) -> None:
        live = self._live.get(key)
        if live is None:
            logger.warning("event for unknown request %d dropped: %s", key, type(event).__name__)
            return
        if isinstance(event, TokenEvent):
            if live.stream:
                held.setdefault(key, []).append(event)
        elif isinstance(event, FinalEvent):
            last = held.pop(key, [])
            try:
                outputs = final_outputs(event, live.stream, live.details, last, self._take_prefix(live))
            except Exception as exc:  # still one final response, as an error
                logger.exception("could not build the final response of request %d", key)
                self._finish_error(key, GenerationError(f"could not build the response: {exc}"), None)
                return
            del self._live[key]
            # Counted before the final is sent, so a client holding its final response sees it in /metrics.
            self._record(lambda m: m.request_succeeded(event, time.monotonic() - live.received_at))
            self._api.send(live.sender, outputs, None, True)
        elif isinstance(event, ErrorEvent):
            self._finish_error(key, event.error, held.pop(key, None))

    def _send_tokens(self, key: int, events: list[TokenEvent]) -> None:
        live = self._live.get(key)
        if live is not None:
            self._api.send(live.sender, token_outputs(events, self._take_prefix(live), live.details), None, False)

    @staticmethod
    def _take_prefix(live: Live) -> str:
        prefix, live.prefix = live.prefix, ""
        return prefix

    def _finish_error(self, key: int, error: BaseException, last: list[TokenEvent] | None) -> None:
        live = self._live.get(key)
        if live is None:
            return
        last = last or self._held.pop(key, None)
        if last:
            self._send_tokens(key, last)  # text generated before the error still reaches the client
        del self._live[key]
        self._record(lambda m: m.request_failed(error))
        self._api.send(live.sender, None, error, True)

    def _poll(self) -> None:
        for live in list(self._live.values()):
            if live.handle is not None and not live.cancel_requested and self._api.is_cancelled(live.sender):
                live.cancel_requested = True
                live.handle.cancel()  # the engine frees its blocks and emits ErrorEvent(CancelledError)
        if self._metrics is not None and self._drain_steps is not None:
            self._metrics.steps(self._drain_steps())
        if self._engine_stats is not None:
            stats = self._engine_stats()
            if self._metrics is not None:
                self._metrics.engine_stats(stats)
            if self._idle_trim is not None:
                self._idle_trim.observe(bool(self._live) or stats.running > 0 or stats.queue_size > 0)

    def _record(self, fn: Callable[[TgiMetrics], None]) -> None:
        if self._metrics is not None:
            self._guard(fn, self._metrics)

    @staticmethod
    def _guard(fn: Callable[..., Any], *args: Any) -> None:
        # A failed send (client gone) or metric call must never stop the other requests' responses.
        try:
            fn(*args)
        except Exception:
            logger.exception("responder: %s failed", getattr(fn, "__name__", fn))
