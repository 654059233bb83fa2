"""A real server for integration tests: tgi-llm-launcher -> tritonserver on free 127.0.0.1 ports, plus
small gRPC/HTTP/metrics clients. The server is always stopped (SIGTERM, then SIGKILL) at teardown."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tgi_llm.ports import free_ports, promised_ports

MODEL = "tgi_llm"
START_TIMEOUT_S = 900.0  # hang guard: first start may convert the GGUF
RESPONSE_TIMEOUT_S = 300.0  # hang guard per response


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0, poll_s: float = 0.1) -> bool:
    """Poll `condition` until true (hang guard, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return condition()


@dataclass
class Launched:
    process: subprocess.Popen
    log_path: Path
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http}/v2/models/{MODEL}/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout_s: float = 120.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                return -9
        return self.process.returncode


@dataclass(frozen=True)
class Loopback:
    """tritonserver's own ports (127.0.0.1 only, behind the gateway) and the launcher's admin secret, read
    from its command line as a local process could."""

    http_port: int
    grpc_port: int
    admin_secret: str

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def loopback(server: Launched) -> Loopback:
    from tgi_llm.launcher.security import ADMIN_HEADER
    from tgi_llm.procfs import children, cmdline

    (argv,) = [cmdline(p) for p in children(server.process.pid) if cmdline(p)[0].endswith("/tritonserver")]
    flags = dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)
    (secret,) = [a.split(f"{ADMIN_HEADER}=", 1)[1] for a in argv if a.startswith("--http-restricted-api=")
                 and f":{ADMIN_HEADER}=" in a]
    return Loopback(int(flags["http-port"]), int(flags["grpc-port"]), secret)


def launch(work_dir: Path, *flags: str, env: dict[str, str] | None = None) -> Launched:
    """Start tgi-llm-launcher (this Python, this checkout) with `flags` on free ports; `env` is added to (or,
    where a value is None, removed from) this process's environment."""
    http, grpc, metrics = free_ports(3, exclude=promised_ports(flags))
    log_path = work_dir / "launcher.log"
    cmd = [
        sys.executable, "-m", "tgi_llm.launcher.main", "--hostname", "127.0.0.1",
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
        "--model-repository", str(work_dir / "work"), "--graceful-termination-timeout", "20", "--port", "0",
        *flags,
    ]
    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in (dict(os.environ) | (env or {})).items() if v is not None}
    env["PYTHONPATH"] = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    with open(log_path, "w") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    return Launched(process, log_path, http, grpc, metrics)


# ---- metrics ----

_LINE = re.compile(r"^([\w:]+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def read_metrics(server: Launched) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            labels = frozenset(_LABEL.findall(m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(snapshot: dict, name: str, **labels: str) -> float:
    return snapshot.get((name, frozenset(labels.items())), 0.0)


# ---- gRPC ----


@dataclass
class Reply:
    texts: list[str] = field(default_factory=list)
    finals: list[bool] = field(default_factory=list)
    finish_reason: str | None = None
    num_output_tokens: int | None = None
    num_cached_tokens: int | None = None
    error: Any = None  # tritonclient InferenceServerException

    @property
    def text(self) -> str:
        return "".join(self.texts)


def grpc_inputs(prompt: str, stream: bool = True, **tensors: Any) -> list:
    import tritonclient.grpc as grpcclient

    types = {bool: "BOOL", int: "INT32", float: "FP32"}
    inputs = []
    for name, value in {"text_input": prompt, "stream": stream, **tensors}.items():
        if isinstance(value, np.ndarray):
            array = value
            dtype = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32", np.dtype(np.uint64): "UINT64",
                     np.dtype(np.bool_): "BOOL"}[array.dtype]
        elif isinstance(value, str):
            array, dtype = np.array([value.encode()], dtype=np.object_), "BYTES"
        else:
            dtype = types[type(value)]
            array = np.array([value], dtype={"BOOL": np.bool_, "INT32": np.int32, "FP32": np.float32}[dtype])
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def grpc_generate(server: Launched, prompt: str, stream: bool = True, parameters: dict | None = None,
                  on_response: Callable[[Reply], bool] | None = None, status_header: bool = True,
                  **tensors: Any) -> Reply:
    """One request on its own gRPC stream (with `triton_grpc_error` unless `status_header` is False, so errors
    carry their status code). `on_response(reply)` runs after each response; returning True cancels the
    stream there."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    reply = Reply()
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)),
                            headers={"triton_grpc_error": "true"} if status_header else None)
        client.async_stream_infer(MODEL, grpc_inputs(prompt, stream, **tensors), parameters=parameters)
        while True:
            result, error = responses.get(timeout=RESPONSE_TIMEOUT_S)
            if error is not None:
                reply.error = error
                return reply
            out = result.as_numpy("text_output")
            reply.texts.append(out.reshape(-1)[0].decode() if out is not None else "")
            final = result.get_response().parameters["triton_final_response"].bool_param
            reply.finals.append(final)
            reason = result.as_numpy("finish_reason")
            if reason is not None:
                reply.finish_reason = reason.reshape(-1)[0].decode()
                reply.num_output_tokens = int(result.as_numpy("num_output_tokens").reshape(-1)[0])
                reply.num_cached_tokens = int(result.as_numpy("num_cached_tokens").reshape(-1)[0])
            if on_response is not None and on_response(reply):
                client.stop_stream(cancel_requests=True)
                return reply
            if final:
                return reply
    finally:
        client.stop_stream()
        client.close()


# ---- HTTP generate extension ----


def http_generate(server: Launched, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{server.http}/v2/models/{MODEL}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=RESPONSE_TIMEOUT_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def http_generate_stream(server: Launched, body: dict) -> list[dict]:
    """Server-sent events of /generate_stream, each `data:` line parsed."""
    request = urllib.request.Request(f"{server.http}/v2/models/{MODEL}/generate_stream",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    events = []
    with urllib.request.urlopen(request, timeout=RESPONSE_TIMEOUT_S) as r:
        assert r.headers.get("Content-Type", "").startswith("text/event-stream")
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data:"):
                events.append(json.loads(line[len("data:"):]))
    return events


class OpenStream:
    """A streaming request left running (for load and overload tests); `cancel()` ends it client-side."""

    def __init__(self, server: Launched, prompt: str, **tensors: Any) -> None:
        import tritonclient.grpc as grpcclient

        self.responses: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(server.grpc)
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)),
                                 headers={"triton_grpc_error": "true"})
        self.client.async_stream_infer(MODEL, grpc_inputs(prompt, True, **tensors))

    def first(self) -> tuple[Any, Any]:
        return self.responses.get(timeout=RESPONSE_TIMEOUT_S)

    def cancel(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()
