"""PbResponses over a stand-in for pb_utils: what an error response carries, tagged or not."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from tgi_llm.errors import OverloadedError, ValidationError
from tgi_llm.triton.pb_api import PbResponses
from tgi_llm.triton.status import CodeTaggingSender


@dataclass
class TritonError:
    message: str
    code: int


@dataclass
class InferenceResponse:
    output_tensors: list = field(default_factory=list)
    error: TritonError | None = None


PB = SimpleNamespace(
    TritonError=type("TritonError", (TritonError,), {"INVALID_ARG": 3, "UNAVAILABLE": 14, "INTERNAL": 13,
                                                     "CANCELLED": 1}),
    InferenceResponse=InferenceResponse,
    Tensor=lambda name, array: (name, array),
    TRITONSERVER_RESPONSE_COMPLETE_FINAL=1,
)


@dataclass
class Sender:
    sent: list[tuple[Any, int]] = field(default_factory=list)

    def send(self, response: Any, flags: int = 0) -> None:
        self.sent.append((response, flags))


def test_errors_carry_their_code_and_a_tag_only_when_asked():
    plain, asked = Sender(), Sender()
    responses = PbResponses(PB)
    responses.send(plain, None, ValidationError("`top_p` must be > 0.0"), True)
    responses.send(CodeTaggingSender(asked), None, ValidationError("`top_p` must be > 0.0"), True)
    responses.send(CodeTaggingSender(asked), None, OverloadedError("Model is overloaded"), True)
    ((response, flags),) = plain.sent
    assert (response.error.message, response.error.code, flags) == ("`top_p` must be > 0.0", 3, 1)
    assert [(r.error.message, r.error.code) for r, _ in asked.sent] == [
        ("[tgi_llm INVALID_ARG] `top_p` must be > 0.0", 3), ("[tgi_llm UNAVAILABLE] Model is overloaded", 14)]


def test_tokens_are_sent_alike_through_a_tagging_sender():
    sender = Sender()
    PbResponses(PB).send(CodeTaggingSender(sender), {"text_output": "hi"}, None, False)
    ((response, flags),) = sender.sent
    assert (response.output_tensors, response.error, flags) == ([("text_output", "hi")], None, 0)
