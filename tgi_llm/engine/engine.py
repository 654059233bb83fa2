"""The engine: validate, queue, schedule, run one mixed prefill/decode forward per step, emit events.

One thread runs the loop. `submit` and `cancel` may be called from any thread; they only touch
the inbox. Events are delivered through each request's `on_event` callback on the engine thread,
so callbacks must not block (the Triton adapter queues them for its responder thread).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, Protocol

from tgi_llm.engine.detokenizer import IncrementalDetokenizer
from tgi_llm.engine.grammar import GrammarCompiler
from tgi_llm.engine.kv_cache_manager import KVCacheManager
from tgi_llm.engine.kv_events import KVEvent, KVEventLog
from tgi_llm.engine.limits import Limits
from tgi_llm.engine.postprocess import Postprocessor
from tgi_llm.engine.runner_protocol import Runner
from tgi_llm.engine.scheduler import Scheduler
from tgi_llm.engine.sequence import Sequence
from tgi_llm.engine.stats import EngineStats, StepStats
from tgi_llm.engine.step_plan import StepPlan
from tgi_llm.engine.stopping import StopChecker
from tgi_llm.engine.validation import Validator
from tgi_llm.errors import (
    CancelledError,
    GenerationError,
    OverloadedError,
    ShutdownError,
    TgiError,
    ValidationError,
)
from tgi_llm.events import ErrorEvent, Event
from tgi_llm.lora.registry import LoraLoadError, LoraRegistry, LoraStats
from tgi_llm.request import ValidRequest
from tgi_llm.speculation.proposer import Proposer

logger = logging.getLogger(__name__)


class KVEventSink(Protocol):
    """Where each step's KV-cache events go (kv_event_publisher.ZmqKVEventPublisher)."""

    def publish(self, events: list[KVEvent]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RequestHandle:
    request_id: int
    _engine: Engine

    def cancel(self) -> None:
        self._engine.cancel(self.request_id)


class Engine:
    """Wires validator, scheduler, runner and postprocessor; use `tgi_llm.engine.build_engine`."""

    def __init__(self, tokenizer: Any, limits: Limits, runner: Runner, eos_token_ids: set[int],
                 model_id: str = "", vocab_size: int | None = None, proposer: Proposer | None = None,
                 lora: LoraRegistry | None = None, kv_events: KVEventSink | None = None,
                 kv_medium: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.model_id = model_id
        self.runner = runner
        self.eos_token_ids = frozenset(eos_token_ids)
        self.grammars = GrammarCompiler(tokenizer, vocab_size or len(tokenizer), eos_token_ids)
        #: The LoRA adapters requests may name (None: the server takes none).
        self.lora = lora
        self.validator = Validator(tokenizer, limits, self.grammars, lora, frozenset({model_id}))
        self.kv = KVCacheManager(limits.num_blocks, limits.block_size, limits.prefix_caching)
        #: --kv-events-endpoint: the prefix cache's changes go out after every step, in order.
        self.kv_events = kv_events
        if kv_events is not None:
            self.kv.events = KVEventLog(limits.block_size, kv_medium)
            self.kv.events.cleared()  # a subscriber that knew an earlier life of this server forgets it
        self.scheduler = Scheduler(limits, self.kv, proposer, lora)
        self.postprocessor = Postprocessor(tokenizer)
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._inbox: deque[Sequence] = deque()
        self._cancels: deque[int] = deque()
        self._live: dict[int, Sequence] = {}  # every request between submit and its final event
        self._step_stats: deque[StepStats] = deque(maxlen=4096)
        self._running = False
        self._thread: threading.Thread | None = None
        self._batch_size = 0
        self._batch_max_tokens = 0
        self.healthy = True
        self._grammar_requests = 0

    # ---- public API (any thread) ----
    def validate(self, inputs: str | Seq[int], params: Mapping[str, Any] | None = None,
                 stream: bool = False) -> ValidRequest:
        return self.validator.validate(inputs, params, stream=stream)

    def submit(self, request: ValidRequest, on_event: Callable[[Event], None]) -> RequestHandle:
        with self._cond:
            if not self._running:
                raise ShutdownError()
            if len(self._live) >= self.limits.max_concurrent_requests:
                raise OverloadedError()
            seq = Sequence(next(self._ids), request, on_event,
                           IncrementalDetokenizer(self.tokenizer, request.input_ids),
                           StopChecker(self.eos_token_ids, request.stopping))
            self._live[seq.request_id] = seq
            if request.lora is not None and self.lora is not None:
                self.lora.hold(request.lora)
            self._inbox.append(seq)
            self._grammar_requests += request.grammar is not None
            self._cond.notify()
        return RequestHandle(seq.request_id, self)

    def cancel(self, request_id: int) -> None:
        with self._cond:
            self._cancels.append(request_id)
            self._cond.notify()

    def stats(self) -> EngineStats:
        return EngineStats(
            queue_size=len(self.scheduler.waiting) + len(self._inbox),
            batch_size=self._batch_size,
            batch_max_tokens=self._batch_max_tokens,
            kv_blocks_total=self.kv.num_blocks,
            kv_blocks_free=self.kv.num_free,
            kv_blocks_cached=self.kv.num_cached_free,
            running=len(self._live),
            prefix_cache_queried_tokens=self.kv.counters.queried_tokens,
            prefix_cache_hit_tokens=self.kv.counters.hit_tokens,
            grammar_requests=self._grammar_requests,
            grammar_compiled=self.grammars.stats.compiled,
            grammar_cache_hits=self.grammars.stats.cache_hits,
            grammar_compile_s=self.grammars.stats.compile_s,
            spec_drafts=self.scheduler.num_drafts,
            spec_draft_tokens=self.scheduler.num_draft_tokens,
            spec_accepted_tokens=self.scheduler.num_accepted_tokens,
            lora=self.lora_stats(),
        )

    def lora_stats(self) -> LoraStats | None:
        """The LoRA gauges' values (None: no LoRA); read off the engine thread, so the queue is copied first."""
        if self.lora is None:
            return None
        with self._cond:
            queued = [s.request.lora for s in self._inbox if s.request.lora is not None]
        queued += [s.request.lora for s in list(self.scheduler.waiting) if s.request.lora is not None]
        return self.lora.stats(queued)

    def drain_step_stats(self) -> list[StepStats]:
        """Per-step timings since the last call (for metrics, read off the engine thread)."""
        out = []
        while self._step_stats:
            out.append(self._step_stats.popleft())
        return out

    def start(self) -> None:
        with self._cond:
            if self._running:
                return
            self._running = True
        self._publish_kv_events()  # AllBlocksCleared, before the engine thread owns the log
        self._thread = threading.Thread(target=self._loop, name="tgi-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop; every request still in flight ends with a ShutdownError event."""
        with self._cond:
            self._running = False
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._fail_all(ShutdownError())
        self.runner.close()
        if self.kv_events is not None:
            self._publish_kv_events()
            self.kv_events.close()

    # ---- engine thread ----
    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while self._running and not self._inbox and not self._cancels \
                            and not self.scheduler.has_work():
                        self._cond.wait()
                    if not self._running:
                        return
                    new = list(self._inbox)
                    self._inbox.clear()
                    cancels = list(self._cancels)
                    self._cancels.clear()
                for seq in new:
                    self.scheduler.add(seq)
                for request_id in cancels:
                    self._cancel_now(request_id)
                self.step()
                self._publish_kv_events()
        except BaseException as exc:  # the loop must never die silently: fail every request
            logger.exception("Engine loop crashed")
            self.healthy = False
            with self._cond:
                self._running = False
            self._fail_all(GenerationError(f"Engine loop crashed: {exc}"))

    def step(self) -> None:
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        self._update_batch_gauges()
        if plan.is_empty:
            return
        t1 = time.perf_counter()
        try:
            results = self.runner.execute(plan)
        except Exception as exc:  # a failed forward ends the requests in it, nothing else
            logger.exception("Forward failed for %d sequences", len(plan.seqs))
            if isinstance(exc, LoraLoadError) and self.lora is not None:
                self.lora.forget(exc.slot)
            for entry in plan.seqs:
                seq = self.scheduler.running[entry.request_id]
                self._end(seq, ErrorEvent(seq.request_id, GenerationError(str(exc) or repr(exc))))
            self._update_batch_gauges()
            return
        t2 = time.perf_counter()
        for seq, added in self.scheduler.update(plan, results):
            for i in range(seq.num_generated - added, seq.num_generated):  # every accepted token is an event
                self._emit(seq, self.postprocessor.token_event(seq, i))
            if seq.finish_reason is not None:
                self._end(seq, self.postprocessor.final_event(seq))
        for entry, result in zip(plan.seqs, results, strict=True):
            if result is not None and result.error is not None:
                seq = self.scheduler.running[entry.request_id]
                self._end(seq, ErrorEvent(seq.request_id, ValidationError(result.error)))
        t3 = time.perf_counter()
        decodes = sum(1 for s in plan.seqs if s.is_decode)
        decode_rows = sum(s.num_tokens for s in plan.seqs if s.is_decode)  # with their drafts
        chunks = [(s.start, s.num_tokens) for s in plan.seqs if not s.is_decode]
        self.scheduler.pacer.observe(plan.num_tokens, decode_rows, t3 - t0, chunks)
        if not chunks:
            self.scheduler.speculation.observe(decode_rows, t3 - t0)
        # tools/pacer_replay.py reads these lines (LOG_LEVEL=debug) to judge the pacer on served steps.
        logger.debug("step: %d tokens, %d decodes, %.4f s, chunks %s", plan.num_tokens, decodes, t3 - t0, chunks)
        self._update_batch_gauges()
        self._record(plan, decodes, t1 - t0, t3 - t2, t2 - t1)

    def _publish_kv_events(self) -> None:
        if self.kv_events is not None and self.kv.events is not None and self.kv.events.pending:
            self.kv_events.publish(self.kv.events.drain())

    def _update_batch_gauges(self) -> None:
        self._batch_size = len(self.scheduler.running)
        self._batch_max_tokens = self.scheduler.batch_max_tokens

    def _record(self, plan: StepPlan, decodes: int, schedule_s: float, update_s: float, forward_s: float) -> None:
        masks = getattr(getattr(self.runner, "grammar", None), "mask_times_s", None)
        mask_s = 0.0
        while masks:
            mask_s += masks.popleft()
        self._step_stats.append(StepStats(
            method="decode" if decodes == len(plan.seqs) else "prefill", batch_size=len(plan.seqs),
            num_tokens=plan.num_tokens, num_prefill=len(plan.seqs) - decodes, forward_s=forward_s,
            bookkeeping_s=schedule_s + update_s, schedule_s=schedule_s, grammar_mask_s=mask_s,
        ))

    def _cancel_now(self, request_id: int) -> None:
        seq = self._live.get(request_id)
        if seq is not None:
            self._end(seq, ErrorEvent(request_id, CancelledError()))

    def _end(self, seq: Sequence, event: Event) -> None:
        """The one place a request leaves the engine: blocks freed, state dropped, final event sent."""
        self.scheduler.finish(seq)  # blocks back; the runner drops its state with the next plan
        with self._cond:
            live = self._live.pop(seq.request_id, None) is not None
        if live and seq.request.lora is not None and self.lora is not None:
            self.lora.drop(seq.request.lora)
        self._emit(seq, event)

    def _fail_all(self, error: TgiError) -> None:
        with self._cond:
            pending = list(self._live.values())
            self._inbox.clear()
        for seq in pending:
            self._end(seq, ErrorEvent(seq.request_id, error))

    @staticmethod
    def _emit(seq: Sequence, event: Event) -> None:
        try:
            seq.on_event(event)
        except Exception:  # a broken callback must not take the engine down
            logger.exception("on_event callback failed for request %d", seq.request_id)
