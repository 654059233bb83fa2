"""A real stack for the integration tests: `tgi-llm-launcher` (gateway, tritonserver + the tgi_llm model, and
the TGI/OpenAI front on --port) on free 127.0.0.1 ports, started once per test session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tgi_llm.ports import free_ports


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group we created for it (tritonserver is the launcher's child), then wait."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def wait_until(check, proc: subprocess.Popen, what: str, log: Path, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} not ready after {limit_s}s:\n{log.read_text()[-4000:]}")


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=Path(__file__).resolve().parents[2])


@dataclass
class Stack:
    triton_http: str
    grpc: str
    metrics: str
    front: str
    launcher_pid: int = 0
    log: Path | None = None  # the launcher's output, the front's log lines included

    def tritonserver_pid(self) -> int | None:
        from tgi_llm.procfs import children, cmdline

        pids = [p for p in children(self.launcher_pid) if (cmdline(p) or [""])[0].endswith("/tritonserver")]
        return pids[0] if pids else None


def start_front(stack_grpc: str, metrics: str, model_dir: Path, tmp: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    (port,) = free_ports(1)
    log = tmp / f"front-{port}.log"
    proc = spawn(["-m", "tgi_llm.front.main", "--port", str(port), "--hostname", "127.0.0.1",
                  "--triton-grpc-url", stack_grpc, "--triton-metrics-url", metrics, "--model-id", "SmolLM2",
                  "--tokenizer-dir", str(model_dir), "--max-input-tokens", "511", "--max-total-tokens", "512",
                  *extra], log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/health").status_code == 200, proc, "tgi-llm-front", log, 120)
    except BaseException:
        stop(proc)
        raise
    return proc, url


def launch_stack(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The launcher with the default model (512-token context, a small KV pool); stopped afterwards."""
    tmp = tmp_path_factory.mktemp("front-integration")
    from tgi_llm.launcher.tritonserver import find_tritonserver

    try:
        find_tritonserver(tmp)
    except FileNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")
    http, grpc, metrics, port = free_ports(4)
    log = tmp / "launcher.log"
    # The launcher starts the front itself on --port, as users run it.
    launcher = spawn(["-m", "tgi_llm.launcher.main", "--model-id", str(default_model_dir), "--hostname", "127.0.0.1",
                      "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
                      "--port", str(port), "--max-total-tokens", "512", "--max-batch-total-tokens", "2048",
                      "--model-repository", str(tmp / "repo")], log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(url + "/health").status_code == 200, launcher, "tgi-llm-launcher", log)
        yield Stack(f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"http://127.0.0.1:{metrics}/metrics", url,
                    launcher.pid, log)
    finally:
        stop(launcher)
