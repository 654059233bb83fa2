"""Triton's error answers as the statuses clients expect; everything else unchanged."""

from __future__ import annotations

import grpc

from tgi_llm.gateway.statuses import UNAUTHORIZED, grpc_error, http_error, in_stream_error, unavailable_message

M = "tgi_llm"


def test_http_overload_is_429_and_a_missing_model_503():
    assert http_error(400, "Model is overloaded", M) == (429, "Model is overloaded")
    assert http_error(400, "Request for unknown model: 'tgi_llm' has no available versions", M) == (
        503, unavailable_message(M))
    assert http_error(400, "Stub process 'tgi_llm_0_0' is not healthy.", M)[0] == 503
    assert http_error(400, "The model is shutting down", M)[0] == 503
    assert http_error(404, "Request for unknown model: 'other' is not found", M) == (
        404, "Request for unknown model: 'other' is not found")


def test_http_restricted_inference_without_the_key_is_401():
    assert http_error(403, "This API is restricted, expecting header 'authorization'", M) == (401, UNAUTHORIZED)
    other = "This API is restricted, expecting header 'x-tgi-llm-admin'"
    assert http_error(403, other, M) == (403, other)


def test_validation_errors_keep_their_status_and_message():
    assert http_error(400, "`top_p` must be > 0.0 and < 1.0", M) == (400, "`top_p` must be > 0.0 and < 1.0")


def test_grpc_codes():
    auth = "This protocol is restricted, expecting header 'triton-grpc-protocol-authorization'"
    assert grpc_error(grpc.StatusCode.UNAVAILABLE, auth, M) == (grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED)
    gone = "Request for unknown model: 'tgi_llm' is not found"
    assert grpc_error(grpc.StatusCode.NOT_FOUND, gone, M) == (grpc.StatusCode.UNAVAILABLE, unavailable_message(M))
    assert grpc_error(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses", M) == (
        grpc.StatusCode.UNAVAILABLE, unavailable_message(M))
    assert grpc_error(grpc.StatusCode.UNAVAILABLE, "Model is overloaded", M) == (
        grpc.StatusCode.UNAVAILABLE, "Model is overloaded")
    assert grpc_error(grpc.StatusCode.INVALID_ARGUMENT, "`top_p` must be", M) == (
        grpc.StatusCode.INVALID_ARGUMENT, "`top_p` must be")


def test_in_stream_errors_get_a_status():
    dtype = "inference input 'top_k' data-type is 'FP32', but model 'tgi_llm' expects 'INT32'"
    assert in_stream_error(dtype, M) == (grpc.StatusCode.INVALID_ARGUMENT, dtype)
    assert in_stream_error("Model is overloaded", M)[0] == grpc.StatusCode.UNAVAILABLE
    assert in_stream_error("Stub process 'tgi_llm_0_0' is not healthy.", M)[0] == grpc.StatusCode.UNAVAILABLE
