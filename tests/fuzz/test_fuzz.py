"""Property-based hostile requests against a real launched server (gateway, tritonserver, TGI/OpenAI front),
on every API: each answer is a success or a 4xx / INVALID_ARGUMENT naming a field, never a 5xx or a hang
(tests/fuzz/client.py is the oracle). Meanwhile valid streams keep flowing and must each end with exactly one
final response, /health stays fast, and afterwards the queue and the KV blocks are back to zero.

CI runs a fixed, derandomized set (FUZZ_EXAMPLES per test, default 30); `tools/fuzz.py` runs more, random.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.client import (
    GrpcStreams,
    HealthWatch,
    build_request,
    check_grpc,
    check_http,
    drained,
    http_send,
)
from tests.fuzz.strategies import (
    GrpcCase,
    Tensor,
    chat_case,
    completion_case,
    grpc_case,
    raw_bytes,
    tgi_case,
    tokenize_case,
    triton_generate_case,
    triton_infer_case,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
                derandomize=not os.environ.get("FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@dataclass
class Background:
    """Valid requests sent in a loop (gRPC streams and TGI /generate) while the fuzzer runs: each must end
    with exactly one final response, whatever the hostile requests beside it do."""

    stack: object
    served: int = 0
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        grpc = GrpcStreams(self.stack.grpc)
        valid = GrpcCase([Tensor("text_input", "BYTES", [1], [b"Hello there"], raw_bytes("BYTES", [b"Hello there"])),
                          Tensor("max_tokens", "INT32", [1], [8], raw_bytes("INT32", [8])),
                          Tensor("stream", "BOOL", [1], [True], b"\x01")])
        try:
            with httpx.Client(base_url=self.stack.front, timeout=120) as http:
                while not self.stop.is_set():
                    result = grpc.run([build_request(valid)])
                    if result.code is not None or result.stream_errors or result.finals() != 1:
                        self.failures.append(f"gRPC: {result.code} {result.details} {result.stream_errors} "
                                             f"finals={result.finals()}")
                    r = http.post("/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 8}})
                    if r.status_code != 200 or not isinstance(r.json().get("generated_text"), str):
                        self.failures.append(f"/generate: {r.status_code} {r.text[:300]}")
                    self.served += 2
        finally:
            grpc.close()


@pytest.fixture(scope="module")
def fuzzing(stack) -> Iterator[tuple[HealthWatch, Background]]:
    """The health probes and the valid background traffic, for the whole module; the checks after it run in
    test_the_server_kept_its_invariants."""
    watch = HealthWatch([stack.front + "/health", stack.triton_http + "/v2/health/ready"])
    background = Background(stack)
    thread = threading.Thread(target=background.run, daemon=True)
    with watch:
        thread.start()
        yield watch, background
        background.stop.set()
        thread.join(180)


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


@pytest.fixture(scope="module")
def grpc_streams(stack) -> Iterator[GrpcStreams]:
    streams = GrpcStreams(stack.grpc)
    yield streams
    streams.close()


@FUZZ
@given(case=st.one_of(tgi_case(), tokenize_case()))
def test_tgi_routes(stack, fuzzing, http, case):
    check_http(case, http_send(http, stack.front, case))


@FUZZ
@given(case=st.one_of(chat_case(), completion_case()))
def test_openai_routes(stack, fuzzing, http, case):
    check_http(case, http_send(http, stack.front, case))


@FUZZ
@given(case=st.one_of(triton_generate_case(), triton_infer_case()))
def test_triton_http(stack, fuzzing, http, case):
    check_http(case, http_send(http, stack.triton_http, case))


@FUZZ
@given(case=grpc_case())
def test_triton_grpc_tensors(stack, fuzzing, grpc_streams, case):
    check_grpc(case, grpc_streams.run([build_request(case)], status_header=case.status_header))


def test_the_server_kept_its_invariants(stack, fuzzing):
    """Run last in this module: /health was never slow (a stalled event loop once held it ~9 s), every valid
    background request ended with one final response, and nothing is left in the queue or the KV cache."""
    watch, background = fuzzing
    background.stop.set()
    deadline = time.monotonic() + 180
    while background.served == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert background.served > 0, "no valid background request completed"
    assert not background.failures, background.failures[:5]
    assert not watch.slow_since(0.0), watch.slow_since(0.0)[:5]
    assert drained(stack.metrics) == {
        "tgi_queue_size": 0.0, "tgi_batch_current_size": 0.0, "tgi_kv_blocks_used": 0.0}
