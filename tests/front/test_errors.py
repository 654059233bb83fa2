"""Triton's errors -> TGI's error types and status codes."""

from __future__ import annotations

import logging

import pytest

from tgi_llm.front.errors import from_triton


@pytest.mark.parametrize(
    "message,status,error_type,code",
    [
        ("`temperature` must be strictly positive", None, "validation", 422),
        ("[request id: abc] `inputs` must have less than 10 tokens. Given: 12", None, "validation", 422),
        ("anything at all", "StatusCode.INVALID_ARGUMENT", "validation", 422),
        ("Model is overloaded", None, "overloaded", 429),
        ("Model is overloaded", "StatusCode.UNAVAILABLE", "overloaded", 429),
        ("failed to connect to all addresses", "StatusCode.UNAVAILABLE", "unavailable", 503),
        ("Request failed during generation: CUDA error", None, "generation", 424),
        ("", "StatusCode.INTERNAL", "generation", 424),
        # The model is not loaded (yet, or any more): TGI's 503, not 424.
        ("Request for unknown model: 'tgi_llm' is not found", "StatusCode.NOT_FOUND", "unavailable", 503),
        ("Request for unknown model: 'tgi_llm' has no available versions", None, "unavailable", 503),
        ("Stub process 'tgi_llm_0_0' is not healthy.", None, "unavailable", 503),
        # The model's errors in a stream name their code in a tag (triton/status.py): the code decides.
        ("[tgi_llm INVALID_ARG] anything at all", None, "validation", 422),
        ("[request id: 9] [tgi_llm INVALID_ARG] `top_p` must be > 0.0", None, "validation", 422),
        ("[tgi_llm INTERNAL] the runner failed: shape must be 3", None, "generation", 424),
        ("[tgi_llm UNAVAILABLE] Model is overloaded", None, "overloaded", 429),
        ("[tgi_llm UNAVAILABLE] The model is shutting down", None, "unavailable", 503),
        ("[tgi_llm CANCELLED] Request was cancelled", None, "cancelled", 499),
    ],
)
def test_classification(message: str, status: str | None, error_type: str, code: int) -> None:
    err = from_triton(message, status)
    assert (err.error_type, err.status) == (error_type, code)
    assert not err.message.startswith("[request id") and "[tgi_llm" not in err.message


def test_an_unexpected_exception_is_a_json_500_and_one_log_line(client, caplog) -> None:
    """TestClient re-raises what escapes the app: before the catch-all, the RuntimeError reached this test
    (and uvicorn logged its traceback)."""
    with caplog.at_level(logging.ERROR):
        r = client.post("/generate", json={"inputs": "crash"})
        assert (r.status_code, r.json()) == (500, {"error": "Internal server error (RuntimeError)",
                                                   "error_type": "internal"})
        r = client.post("/v1/completions", json={"prompt": "crash"})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    records = [rec for rec in caplog.records if rec.name == "tgi_llm.front"]
    assert [rec.getMessage() for rec in records] == [
        f"POST {route} failed: RuntimeError: 'unexpected\\nsecond line'" for route in ("/generate", "/v1/completions")]
    assert all(rec.exc_info is None for rec in records)  # one line, no traceback
