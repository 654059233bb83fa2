"""Error codes and the tag that carries one inside a message (the front and the gateway read it back)."""

from __future__ import annotations

import json

import pytest

from tgi_llm.errors import GenerationError, OverloadedError, ValidationError
from tgi_llm.triton.status import (
    ERROR_CODE_PARAMETER,
    CodeTaggingSender,
    split_error_tag,
    tag_error,
    triton_code,
    wants_error_code,
)


@pytest.mark.parametrize(
    ("parameters", "wanted"),
    [
        (json.dumps({ERROR_CODE_PARAMETER: True, "max_new_tokens": 3}), True),
        ({ERROR_CODE_PARAMETER: True}, True),
        (json.dumps({ERROR_CODE_PARAMETER: False}), False),
        (json.dumps({ERROR_CODE_PARAMETER: "true"}), False),  # a bool parameter, as the front and gateway send
        (json.dumps({"max_new_tokens": 3}), False),
        ('{"tgi_llm_error_code": tru', False),  # not JSON: parse_request names that error itself
        (json.dumps([ERROR_CODE_PARAMETER]), False),
        ("", False),
        (None, False),
    ],
)
def test_wants_error_code(parameters, wanted):
    assert wants_error_code(parameters) is wanted


@pytest.mark.parametrize("error", [ValidationError("`top_p` must be > 0.0"), OverloadedError("Model is overloaded"),
                                   GenerationError("[tgi_llm X] looks like a tag")])
def test_a_tagged_message_splits_into_its_code_and_the_message(error):
    code = triton_code(error)
    assert split_error_tag(tag_error(str(error), code)) == (code, str(error))


def test_the_tag_is_found_after_tritons_request_id():
    message = "[request id: 7] " + tag_error("`top_p` must be > 0.0", "INVALID_ARG")
    assert split_error_tag(message) == ("INVALID_ARG", "[request id: 7] `top_p` must be > 0.0")


@pytest.mark.parametrize("message", ["`top_p` must be > 0.0", "[tgi_llm invalid] lower case is not a code",
                                     "text [tgi_llm INTERNAL] not at the start", ""])
def test_untagged_messages_pass_unchanged(message):
    assert split_error_tag(message) == (None, message)


def test_the_tagging_sender_forwards_to_the_real_one():
    class Sender:
        def __init__(self):
            self.sent = []

        def send(self, response=None, flags=0):
            self.sent.append((response, flags))

        def is_cancelled(self):
            return True

    inner = Sender()
    wrapped = CodeTaggingSender(inner)
    wrapped.send("r", flags=2)
    assert inner.sent == [("r", 2)] and wrapped.is_cancelled() is True
