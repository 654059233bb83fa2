"""The model's process dies under load (SIGKILL of the Python backend stub): every request in flight ends
with an error within 5 s, the launcher restarts tritonserver (the default --on-model-failure) while the
public ports answer 503, serving resumes within 60 s, no shared memory is left; then a graceful stop after
load exits 0 within 10 s, with the model's finalize run; the killed tritonserver's Python backend directory
is removed."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass

import httpx
import pytest

from tgi_llm.launcher.process import runs_instance_of
from tgi_llm.launcher.shm import SHM_DIR
from tgi_llm.ports import free_ports
from tgi_llm.procfs import children, cmdline

from .harness import MODEL, START_TIMEOUT_S, Launched, grpc_generate, launch, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LONG = {"max_tokens": 400, "ignore_eos": True}  # far longer than the test: in flight when the stub dies
#: TGI's parameters have no ignore_eos: a prompt whose greedy continuation runs all 400 tokens (the default model
#: counts on), where "Tell me" ends at EOS after 7 and could finish as the stub is killed
COUNTING = "Count from 1 to 500, separated by commas: 1, 2, 3,"


@dataclass
class Outcome:
    kind: str
    ended_at: float = 0.0
    tokens: int = 0
    error: str | None = None


def stub_of(server: Launched) -> tuple[int, str]:
    """(pid, shared-memory region) of the model's stub."""
    (triton,) = [p for p in children(server.process.pid) if cmdline(p)[0].endswith("/tritonserver")]
    (stub,) = [p for p in children(triton) if runs_instance_of(cmdline(p), "tgi_llm")]  # not tgi_llm_trtllm's
    return stub, cmdline(stub)[2]


def grpc_stream(server: Launched, started: threading.Event, out: Outcome) -> None:
    def on_response(reply) -> bool:
        out.tokens = len(reply.texts)
        started.set()
        return False

    reply = grpc_generate(server, "Tell me a long story", on_response=on_response, **LONG)
    out.error = None if reply.error is None else str(reply.error.status())
    out.ended_at = time.monotonic()


def sse_stream(url: str, body: dict, started: threading.Event, out: Outcome) -> None:
    try:
        with httpx.stream("POST", url, json=body, timeout=300) as r:
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}"
            for line in r.iter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[len("data:"):]) if line[5:].strip() not in ("", "[DONE]") else {}
                    if "error" in event:
                        out.error = event["error"]
                    else:
                        out.tokens += 1
                        started.set()
    except httpx.HTTPError as exc:
        out.error = repr(exc)
    out.ended_at = time.monotonic()


def status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def test_killed_model_process_fails_in_flight_requests_restarts_and_stops_cleanly(tmp_path, default_model_dir):
    (front_port,) = free_ports(1)
    server = launch(tmp_path, "--model-id", str(default_model_dir), "--max-input-tokens", "256",
                    "--max-total-tokens", "512", "--max-batch-total-tokens", "8192", "--port", str(front_port))
    front = f"http://127.0.0.1:{front_port}"
    try:
        assert wait_until(lambda: "Ready: HTTP" in server.log_path.read_text() or server.process.poll() is not None,
                          START_TIMEOUT_S) and server.process.poll() is None, server.log_tail()
        stub, region = stub_of(server)
        assert (SHM_DIR / region).exists()

        # Load: gRPC streams and HTTP streams through the gateway, TGI streams through the front.
        outcomes, threads, starts = [], [], []
        targets = [("grpc", lambda s, o: grpc_stream(server, s, o))] * 6 + [
            ("triton http", lambda s, o: sse_stream(f"{server.http}/v2/models/{MODEL}/generate_stream",
                                                    {"text_input": "Tell me", "stream": True, **LONG}, s, o))] * 3 + [
            ("front", lambda s, o: sse_stream(f"{front}/generate_stream",
                                              {"inputs": COUNTING, "parameters": {"max_new_tokens": 400}}, s, o))] * 3
        for kind, target in targets:
            out, started = Outcome(kind), threading.Event()
            thread = threading.Thread(target=target, args=(started, out), daemon=True)
            thread.start()
            outcomes.append(out)
            threads.append(thread)
            starts.append(started)
        assert all(s.wait(120) for s in starts), [(o.kind, o.error) for o in outcomes]  # every one streaming

        os.kill(stub, signal.SIGKILL)
        killed = time.monotonic()
        for thread in threads:
            thread.join(60)
        in_flight = [o for o in outcomes if o.ended_at > killed]
        assert len(in_flight) >= 9, [(o.kind, o.tokens, o.error) for o in outcomes]  # the model is slow here
        for o in in_flight:
            assert o.error is not None, (o.kind, o.tokens)
            assert o.ended_at - killed < 5.0, (o.kind, o.ended_at - killed, o.error)

        # Restarting: the ports stay up and say 503; then the model serves again within 60 s.
        health = []
        while time.monotonic() - killed < 60:
            health.append((status(f"{front}/health"), status(f"{server.http}/v2/health/ready")))
            if health[-1] == (200, 200) and grpc_generate(server, "Hello", max_tokens=2).error is None:
                break
            time.sleep(0.25)
        assert health[-1] == (200, 200), health[-5:]
        assert (503, 503) in health, health[:5]
        assert time.monotonic() - killed < 60
        # logged once the supervisor's own readiness poll has seen the model and it has found the new stub's
        # processes and shared memory: that can come just after the requests above were first answered
        assert wait_until(lambda: "is serving again" in server.log_path.read_text(), timeout_s=10)
        assert not (SHM_DIR / region).exists()  # the dead stub's shared memory was removed

        # Load again, then a graceful stop: exit 0 within 10 s, the model finalized.
        _, new_region = stub_of(server)
        for _ in range(8):
            assert grpc_generate(server, "Count to ten", max_tokens=8).error is None
        assert httpx.post(f"{front}/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 4}},
                          timeout=60).status_code == 200
        start = time.monotonic()
        assert server.stop(timeout_s=60) == 0, server.log_tail()
        assert time.monotonic() - start < 10
        log = server.log_path.read_text()
        assert log.rfind("model finalized") > log.rfind("received SIGTERM")
        assert "Non-graceful termination" not in log[log.rfind("received SIGTERM"):]
        assert not (SHM_DIR / new_region).exists()
        # the killed tritonserver's backend directory was removed by the launcher (the last one removes its own)
        (removed,) = re.findall(r"removed the Python backend directory left by tritonserver: (\S+)", log)
        assert removed.startswith("/tmp/python_env_") and not os.path.exists(removed)
    finally:
        server.stop()
