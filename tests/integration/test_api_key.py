"""--api-key guards Triton's own inference APIs too (HTTP and gRPC, public and loopback ports); health and
metrics stay open; the launcher's HTTP front still reaches the model."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import httpx
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tgi_llm.ports import free_ports

from .harness import MODEL, START_TIMEOUT_S, Launched, grpc_inputs, launch, loopback, wait_until

pytestmark = pytest.mark.integration

KEY = "k3y-for-tests"
BEARER = {"Authorization": f"Bearer {KEY}"}
BODY = {"text_input": "Hello", "max_tokens": 2}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, tiny_llama_dir) -> Iterator[tuple[Launched, str]]:
    (port,) = free_ports(1)
    server = launch(tmp_path_factory.mktemp("keyed"), "--model-id", str(tiny_llama_dir), "--api-key", KEY,
                    "--max-batch-total-tokens", "4096", "--max-input-tokens", "256", "--max-total-tokens", "512",
                    "--port", str(port))
    try:
        if not wait_until(lambda: "Ready: HTTP" in server.log_path.read_text() or server.process.poll() is not None,
                          START_TIMEOUT_S) or server.process.poll() is not None:
            pytest.fail(f"server did not start:\n{server.log_tail()}")
        yield server, f"http://127.0.0.1:{port}"
    finally:
        assert server.stop() == 0, server.log_tail()


def grpc_stream(url: str, headers: dict | None) -> tuple[str | None, str]:
    """One streamed request; (error status or None, text)."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)),
                            headers={"triton_grpc_error": "true", **(headers or {})})
        try:
            client.async_stream_infer(MODEL, grpc_inputs("Hello", False, max_tokens=2))
        except InferenceServerException:
            pass  # the stream already ended (refused when it opened): its error is in the callback
        result, error = responses.get(timeout=120)
        if error is not None:
            return error.status(), error.message()
        return None, result.as_numpy("text_output").reshape(-1)[0].decode()
    finally:
        client.stop_stream()
        client.close()


def test_triton_http_inference_wants_the_key(keyed):
    server, _ = keyed
    generate = f"{server.http}/v2/models/{MODEL}/generate"
    r = httpx.post(generate, json=BODY, timeout=60)
    assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]
    assert httpx.post(generate, json=BODY, headers={"Authorization": "Bearer wrong"}, timeout=60).status_code == 401
    assert httpx.post(generate, json=BODY, headers=BEARER, timeout=60).status_code == 200
    assert httpx.get(f"{server.http}/v2/models/{MODEL}/config", timeout=10).status_code == 401
    assert httpx.get(f"{server.http}/v2/health/ready", timeout=10).status_code == 200  # for load balancers
    assert httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).status_code == 200
    # tritonserver's own port checks it too (Triton's restricted-API header).
    assert httpx.post(f"{loopback(server).http}/v2/models/{MODEL}/generate", json=BODY, timeout=60).status_code == 403


def test_triton_grpc_inference_wants_the_key(keyed):
    server, _ = keyed
    assert grpc_stream(server.grpc, None)[0] == "StatusCode.UNAUTHENTICATED"
    for _ in range(5):  # the gateway's own check: no race with tritonserver's (which once answered INTERNAL)
        assert grpc_stream(server.grpc, {"authorization": "Bearer wrong"})[0] == "StatusCode.UNAUTHENTICATED"
    status, text = grpc_stream(server.grpc, {"authorization": f"Bearer {KEY}"})
    assert status is None and text
    # tritonserver's own port refuses it too: UNAVAILABLE, or INTERNAL when its stream handler races.
    assert grpc_stream(loopback(server).grpc, None)[0] in ("StatusCode.UNAVAILABLE", "StatusCode.INTERNAL")
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        assert client.is_server_live() and client.is_model_ready(MODEL)  # health stays open
    finally:
        client.close()


def test_the_launchers_front_uses_the_key_to_reach_triton(keyed):
    _, front = keyed
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}
    assert httpx.post(f"{front}/generate", json=body, timeout=60).status_code == 401
    r = httpx.post(f"{front}/generate", json=body, headers=BEARER, timeout=60)
    assert r.status_code == 200 and "generated_text" in r.json()
    assert httpx.get(f"{front}/health", timeout=10).status_code == 200


def test_one_check_everywhere_scheme_case_insensitive_key_exact(keyed):
    """RFC 7235: `bearer` is the same scheme as `Bearer`; the key itself is compared exactly (the front once
    lower-cased both, so `Bearer K3Y-FOR-TESTS` passed)."""
    server, front = keyed
    lower_scheme = {"Authorization": f"bearer {KEY}"}
    upper_key = {"Authorization": f"Bearer {KEY.upper()}"}
    generate = f"{server.http}/v2/models/{MODEL}/generate"
    assert httpx.post(generate, json=BODY, headers=lower_scheme, timeout=60).status_code == 200
    assert httpx.post(generate, json=BODY, headers=upper_key, timeout=60).status_code == 401
    status, text = grpc_stream(server.grpc, {"authorization": f"BEARER {KEY}"})
    assert status is None and text
    assert grpc_stream(server.grpc, {"authorization": f"Bearer {KEY.upper()}"})[0] == "StatusCode.UNAUTHENTICATED"
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}
    assert httpx.post(f"{front}/generate", json=body, headers=lower_scheme, timeout=60).status_code == 200
    assert httpx.post(f"{front}/generate", json=body, headers=upper_key, timeout=60).status_code == 401
