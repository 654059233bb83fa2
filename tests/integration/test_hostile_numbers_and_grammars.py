"""Non-finite numbers and grammars that cannot be followed, on Triton's HTTP and gRPC fronts of a real server:
each is a 4xx / INVALID_ARGUMENT naming the field, never a success (NaN once sampled token 0 forever; a
grammar whose matcher failed once ended `eos_token` with output the grammar does not allow)."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from .harness import MODEL, RESPONSE_TIMEOUT_S, grpc_generate, http_generate

pytestmark = pytest.mark.integration

INVALID = "StatusCode.INVALID_ARGUMENT"
#: A schema that only refers to itself: it compiles, and matches nothing.
UNFOLLOWABLE = json.dumps({"$ref": "#"})


def post_raw(server, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(f"{server.http}/v2/models/{MODEL}/generate", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=RESPONSE_TIMEOUT_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_http_generate_refuses_non_finite_json_numbers(server, literal):
    status, body = post_raw(server, b'{"text_input": "Hello", "max_tokens": 2, "temperature": %s}' % literal.encode())
    assert status == 400 and "`temperature` must be a finite number" in body["error"]


@pytest.mark.parametrize("name", ["temperature", "top_p", "typical_p", "repetition_penalty", "presence_penalty"])
def test_grpc_fp32_tensors_holding_nan_or_inf_are_refused(server, name):
    for value in (np.nan, np.inf):
        reply = grpc_generate(server, "Hello", max_tokens=2, **{name: np.array([value], dtype=np.float32)})
        assert reply.error is not None and not reply.texts
        assert reply.error.status() == INVALID and f"`{name}` must be a finite number" in reply.error.message()


def test_non_finite_numbers_inside_json_strings_are_refused_too(server):
    """sampling_parameters (Triton's vLLM format) is a JSON string: Python's parser takes NaN there as well."""
    reply = grpc_generate(server, "Hello", sampling_parameters=json.dumps({"max_tokens": 2, "temperature": "nan"}))
    assert reply.error is not None and reply.error.status() == INVALID and "`temperature`" in reply.error.message()
    status, body = http_generate(server, {"text_input": "Hello", "sampling_parameters": '{"top_p": NaN}'})
    assert status == 400 and "`top_p` must be a finite number" in body["error"]


def test_a_grammar_that_cannot_be_followed_is_refused_not_answered(server):
    reply = grpc_generate(server, "JSON:", max_tokens=8, guided_decoding_guide_type="json_schema",
                          guided_decoding_guide=UNFOLLOWABLE)
    assert reply.error is not None and not reply.texts
    assert reply.error.status() == INVALID and "`grammar` cannot be followed" in reply.error.message()
    status, body = http_generate(server, {"text_input": "JSON:", "max_tokens": 8,
                                          "grammar": json.dumps({"type": "json", "value": {"$ref": "#"}})})
    assert status == 400 and "`grammar` cannot be followed" in body["error"]
    assert grpc_generate(server, "Hello", max_tokens=2).finals[-1] is True  # still serving


@pytest.mark.parametrize("name", ["temperature", "repetition_penalty"])
def test_a_tiny_positive_divisor_gives_finite_logprobs(server, name):
    """Found by the fuzzer: temperature 1.2e-38 made every logit infinite, and the answer carried NaN."""
    status, body = http_generate(server, {"text_input": "Hello", "max_tokens": 3, "details": True,
                                          name: 1.1754943508222875e-38})
    assert status == 200, body
    logprobs = body["token_logprobs"] if isinstance(body["token_logprobs"], list) else [body["token_logprobs"]]
    assert all(isinstance(x, float) and x == x and x <= 0 for x in logprobs), body


def test_top_tokens_the_sampler_ruled_out_are_left_out_not_sent_as_infinity(server):
    """Found by the fuzzer: with top_k 1 the second alternative had logprob -inf, and Triton wrote
    `-Infinity`, which is no JSON. Ruled-out alternatives are left out: top_k 1 leaves one."""
    request = urllib.request.Request(
        f"{server.http}/v2/models/{MODEL}/generate", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"text_input": "0", "max_tokens": 1, "top_k": 1, "top_n_tokens": 2}).encode())
    with urllib.request.urlopen(request, timeout=RESPONSE_TIMEOUT_S) as r:
        raw = r.read()

    def refuse(token):
        raise AssertionError(f"{token} in {raw!r}")

    body = json.loads(raw, parse_constant=refuse)
    ids = body["top_token_ids"] if isinstance(body["top_token_ids"], list) else [body["top_token_ids"]]
    assert len(ids) == 1 and ids[0] >= 0, body
