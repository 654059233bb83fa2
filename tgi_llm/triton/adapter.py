"""What `execute` does for each Triton request: parse, validate, register with the responder, submit.

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
from tgi_llm.triton.inputs import parse_request
from tgi_llm.triton.responder import Live, Responder

logger = logging.getLogger(__name__)


class RequestIO(Protocol):
    def tensor(self, request: Any, name: str) -> np.ndarray | None: ...

    def parameters(self, request: Any) -> str: ...

    def sender(self, request: Any) -> Any: ...


class TritonAdapter:
    """Owns the engine and the responder for the lifetime of the Triton model instance."""

    def __init__(self, engine: Any, responder: Responder) -> None:
        self.engine = engine
        self.responder = responder
        self._keys = itertools.count(1)

    def start(self) -> None:
        self.engine.start()
        self.responder.start()

    def execute(self, requests: Iterable[Any], io: RequestIO) -> None:
        for request in requests:
            self._accept(request, io)

    def _accept(self, request: Any, io: RequestIO) -> None:
        received_at = time.monotonic()
        sender = io.sender(request)
        try:
            parsed = parse_request(lambda name: io.tensor(request, name), io.parameters(request))
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
        """Stop the engine (each request in flight gets its ShutdownError), then flush the responder."""
        try:
            self.engine.shutdown()
        finally:
            self.responder.stop()
