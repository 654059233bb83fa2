"""`--launch`: start `tgi-llm-launcher` on free 127.0.0.1 ports, wait until the model is ready, and
always stop it (SIGTERM, then SIGKILL of its whole process group, so no tritonserver is left behind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tgi_llm.bench.clients import MODEL
from tgi_llm.ports import free_ports, promised_ports


@dataclass
class LaunchedServer:
    process: subprocess.Popen
    log_path: Path
    http_port: int
    grpc_port: int
    metrics_port: int
    _workdir: tempfile.TemporaryDirectory

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/models/{MODEL}/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready():
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"the launcher exited with {self.process.returncode}:\n{self.log_tail()}")
            time.sleep(0.25)
        raise TimeoutError(f"the server was not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, timeout_s: float = 60.0) -> int:
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    pass
            self._kill_group()  # tritonserver and its stub, if the launcher left them
            if self.process.poll() is None:
                self.process.wait(10)
            return self.process.returncode
        finally:
            self._workdir.cleanup()

    def _kill_group(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the group we created with start_new_session
        except (ProcessLookupError, PermissionError):
            pass


def launch(flags: list[str], log_path: Path, timeout_s: float = 900.0) -> LaunchedServer:
    """Start the launcher (this Python, this checkout) with `flags`; returns once the model is ready."""
    http, grpc, metrics = free_ports(3, exclude=promised_ports(flags))  # e.g. the soak's front port
    workdir = tempfile.TemporaryDirectory(prefix="tgi-llm-bench-")
    cmd = [
        sys.executable, "-m", "tgi_llm.launcher.main", "--hostname", "127.0.0.1",
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--port", "0",
        "--model-repository", str(Path(workdir.name) / "repository"), "--graceful-termination-timeout", "20",
        *flags,
    ]
    root = str(Path(__file__).resolve().parents[2])  # so the server runs this checkout's tgi_llm
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
                                   start_new_session=True)
    server = LaunchedServer(process, log_path, http, grpc, metrics, workdir)
    try:
        server.wait_ready(timeout_s)
    except BaseException:
        server.stop()
        raise
    return server
