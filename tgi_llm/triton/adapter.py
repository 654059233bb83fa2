"""What `execute` does for each Triton request: read its tensors, then (on a validation worker) validate,
register with the responder and submit.

Independent of pb_utils (reached through `RequestIO`), so it runs in unit tests with a fake engine.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np

from tgi_llm.errors import GenerationError, TgiError, ValidationError
from tgi_llm.triton.admission import AdmissionPool
from tgi_llm.triton.inputs import ParsedRequest, parse_request
from tgi_llm.triton.lora_admin import admin_request, answer, answer_outputs
from tgi_llm.triton.responder import Live, Responder
from tgi_llm.triton.status import CodeTaggingSender, wants_error_code

logger = logging.getLogger(__name__)


class RequestIO(Protocol):
    def tensor(self, request: Any, name: str) -> np.ndarray | None: ...

    def parameters(self, request: Any) -> str: ...

    def sender(self, request: Any) -> Any: ...


class TritonAdapter:
    """Owns the engine, the responder and the validation workers for the lifetime of the model instance."""

    def __init__(self, engine: Any, responder: Responder, validation_workers: int = 2) -> None:
        self.engine = engine
        self.responder = responder
        self._keys = itertools.count(1)
        limits = engine.limits
        self._max_stop_sequences = limits.max_stop_sequences
        # As many may wait for a worker as may be in flight: beyond that the engine would refuse them anyway.
        self.admission = AdmissionPool(validation_workers, limits.max_concurrent_requests, responder.reject)

    def start(self) -> None:
        self.engine.start()
        self.responder.start()

    def execute(self, requests: Iterable[Any], io: RequestIO) -> None:
        for request in requests:
            self._accept(request, io)

    def _accept(self, request: Any, io: RequestIO) -> None:
        """On Triton's execute thread: only read the tensors (cheap, bounded); the rest runs on a worker."""
        received_at = time.monotonic()
        sender = io.sender(request)
        parameters = io.parameters(request)
        if wants_error_code(parameters):
            sender = CodeTaggingSender(sender)
        admin = admin_request(parameters)
        if admin is not None:  # LoRA admin (reads adapter files): on a worker, one answer
            lora = getattr(self.engine, "lora", None)
            self.admission.submit(sender, lambda: self.responder.answer(sender, answer_outputs(answer(lora, admin))))
            return
        try:
            parsed = parse_request(lambda name: io.tensor(request, name), parameters,
                                   max_stop_sequences=self._max_stop_sequences)
        except ValidationError as exc:
            self.responder.reject(sender, exc)
            return
        except Exception as exc:  # a bug, not the client's fault: still exactly one (error) response
            logger.exception("reading the request crashed")
            self.responder.reject(sender, GenerationError(f"validation failed: {exc}"))
            return
        self.admission.submit(sender, lambda: self._admit(sender, parsed, received_at))

    def _admit(self, sender: Any, parsed: ParsedRequest, received_at: float) -> None:
        """On a validation worker: tokenize and validate, then hand the request to the engine."""
        try:
            valid = self.engine.validate(parsed.inputs, parsed.params, stream=parsed.stream)
        except ValidationError as exc:
            self.responder.reject(sender, exc)
            return
        except Exception as exc:  # a bug, not the client's fault: still exactly one (error) response
            logger.exception("validation crashed")
            self.responder.reject(sender, GenerationError(f"validation failed: {exc}"))
            return
        key = next(self._keys)
        prefix = (valid.input_text or "") if parsed.stream and valid.return_full_text else ""
        details = valid.details or valid.decoder_input_details or valid.top_n_tokens > 0
        live = Live(sender, stream=parsed.stream, details=details, prefix=prefix, received_at=received_at)
        self.responder.register(key, live)
        try:
            live.handle = self.engine.submit(valid, self.responder.callback(key))
        except TgiError as exc:  # overloaded, shutting down
            self.responder.fail(key, exc)
        except Exception as exc:
            logger.exception("submit crashed")
            self.responder.fail(key, GenerationError(f"submit failed: {exc}"))

    def finalize(self) -> None:
        """Stop taking requests (those waiting for validation get a ShutdownError), stop the engine (each
        request in flight gets its ShutdownError), then flush the responder."""
        try:
            self.admission.close()
            self.engine.shutdown()
        finally:
            self.responder.stop()
