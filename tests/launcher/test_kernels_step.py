"""The kernels step: the CPU kernels built in a child beside the weights step, never in the way (a failed
build is the model load's to report; a stop mid-build leaves no compiler and no temporary files)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tgi_llm.launcher import kernels_step

ROOT = str(Path(__file__).resolve().parents[2])


def fake_cc(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + 'if [ "$1" = "--version" ]; then echo "fake-cc 1.0"; exit 0; fi\n' + body,
                    encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def child_env(tmp_path: Path, cc: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "CC": cc, "TGI_LLM_KERNEL_CACHE": str(tmp_path / "cache"),
            "PYTHONPATH": ROOT, "HOME": str(tmp_path)}


def test_the_library_is_built_and_a_failure_is_only_reported(tmp_path):
    code = (
        "import tgi_llm.native as native\n"
        "calls = []\n"
        "def fail():\n"
        "    calls.append('kernels'); raise native.NativeBuildError('no compiler here')\n"
        "native.library_path = fail\n"
        "from tgi_llm.launcher.kernels_step import main\n"
        "code = main(['--log-level', 'info'])\n"
        "print(calls, code, flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=child_env(tmp_path, "cc"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['kernels'] 0"
    assert "the kernels were not built here (the model's load tries again): no compiler here" in done.stderr


def test_a_stop_mid_build_kills_the_compiler_and_leaves_no_temporary_files(tmp_path):
    pid_file = tmp_path / "cc.pid"
    cc = fake_cc(tmp_path / "cc", f"echo $$ > {pid_file}\nexec sleep 120\n")
    child = subprocess.Popen([sys.executable, "-m", "tgi_llm.launcher.kernels_step"], env=child_env(tmp_path, cc),
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert child.poll() is None and time.monotonic() < deadline, child.stderr.read() if child.stderr else ""
        time.sleep(0.1)
    compiler = int(pid_file.read_text())
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 1
    deadline = time.monotonic() + 10
    while _alive(compiler) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(compiler)
    cache = tmp_path / "cache"
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_no_step_where_the_model_runs_on_gpus(monkeypatch):
    monkeypatch.setattr(kernels_step, "count_cuda_devices", lambda: 2)
    assert kernels_step.start_kernels_step("info", json_output=False) is None


def test_the_launcher_starts_it_and_reaps_it(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels_step, "count_cuda_devices", lambda: 0)
    for key, value in child_env(tmp_path, fake_cc(tmp_path / "cc", "exit 1\n")).items():
        monkeypatch.setenv(key, value)
    child = kernels_step.start_kernels_step("info", json_output=True)
    assert child is not None
    assert child.process.wait(timeout=120) == 0  # every build failed: reported, not fatal
    assert child.stop() == 0


@pytest.mark.parametrize("flag", [[], ["--json-output"]])
def test_it_logs_as_the_launcher_does(tmp_path, flag):
    cc = fake_cc(tmp_path / "cc", "echo broken >&2\nexit 1\n")
    done = subprocess.run([sys.executable, "-m", "tgi_llm.launcher.kernels_step", *flag],
                          env=child_env(tmp_path, cc), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0
    lines = [ln for ln in done.stderr.splitlines() if "kernels were not built here" in ln]
    assert len(lines) == 1 and lines[0].startswith("{") == bool(flag)
