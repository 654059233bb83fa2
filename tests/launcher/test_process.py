"""ServerProcess against a stand-in child that prints tritonserver-like log lines."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from tgi_llm.launcher.process import ServerProcess, load_failure, reports_model_finalized

UNLOAD_LINE = 'I1122 18:38:31.583934 15214 model_lifecycle.cc:624] "successfully unloaded \'tgi_llm\' version 1"'


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v2/models/tgi_llm/ready"


def test_wait_ready_gives_up_when_the_model_unloads_itself():
    # The model was ready too briefly to be polled, then unloaded: waiting on must not hang.
    child = f"import sys, time; print({UNLOAD_LINE!r}, flush=True); time.sleep(60)"
    server = ServerProcess([sys.executable, "-c", child], env={})
    server.start()
    try:
        assert server.wait_ready(_closed_port_url(), poll_s=0.05) is False
        assert server.model_unloaded.is_set()
        assert server.process.poll() is None  # still running: the launcher must stop it itself
    finally:
        server.process.kill()
        server.wait()


def test_only_our_models_unload_counts():
    # Another model's unload (an admin loaded and unloaded one) must not stop the launcher.
    other = UNLOAD_LINE.replace("'tgi_llm'", "'tgi_llm_other'")
    child = f"import time; print({other!r}, flush=True); time.sleep(60)"
    server = ServerProcess([sys.executable, "-c", child], env={}, model="tgi_llm")
    server.start()
    try:
        assert server.wait_ready(_closed_port_url(), poll_s=0.05, timeout_s=1.0) is False  # timed out
        assert not server.model_unloaded.is_set()
    finally:
        server.process.kill()
        server.wait()


def test_secrets_are_redacted_from_the_log(capsys):
    child = "print('--http-restricted-api=logging:x-tgi-llm-admin=s3cr3t', flush=True)"
    server = ServerProcess([sys.executable, "-c", child], env={}, redact=["s3cr3t"])
    server.start()
    server.wait()
    err = capsys.readouterr().err
    assert "s3cr3t" not in err and "x-tgi-llm-admin=***" in err


def test_load_failure_reason_is_quoted_from_the_log():
    line = "E1122 failed to load 'tgi_llm' version 1: Internal: ValueError: bad config\\nmore"
    assert load_failure(line) == "Internal: ValueError: bad config"
    assert load_failure(UNLOAD_LINE) is None


def test_model_processes_are_the_stubs_running_the_model():
    # A stand-in tritonserver with three children: the model's stub, another model's stub, something else
    # (Pythons that sleep, with the stub's name as argv[0] and its instance-name argument).
    def child(argv0: str, instance: str) -> str:
        return (f"subprocess.Popen([{argv0!r}, '-c', 'import time; time.sleep(60)', 'model.py', {instance!r}, "
                "'DEFAULT'], executable=sys.executable)")

    spawn = "\n".join([
        "import subprocess, sys, time",
        f"ours = {child('/opt/tritonserver/backends/python/triton_python_backend_stub', 'tgi_llm_0_0')}",
        child("triton_python_backend_stub", "other_0_0"),
        child("triton_python_backend_stub", "tgi_llm_trtllm_0_0"),  # a model whose name starts with ours
        child("python3", "tgi_llm_0_0"),
        "time.sleep(60)",
    ])
    server = ServerProcess([sys.executable, "-c", spawn], env={})
    server.start()
    try:
        found: list[int] = []
        for _ in range(200):  # hang guard while the children start
            found = server.model_processes("tgi_llm")
            if found:
                break
            time.sleep(0.05)
        assert len(found) == 1
        assert server.model_processes("other") != found and len(server.model_processes("other")) == 1
        assert server.model_processes("absent") == []
    finally:
        os.killpg(server.process.pid, signal.SIGKILL)  # its own session: the children go too
        server.wait()


def _running(pid: int) -> bool:
    """Alive and not a zombie (a reaper may be slow, or absent in a container)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_kill_after_tritonserver_died_ends_what_it_left_running(tmp_path):
    """A crashed tritonserver leaves its stubs running in its session; kill() ends them."""
    pid_file = tmp_path / "stub.pid"
    left = ("import subprocess, sys; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))")
    server = ServerProcess([sys.executable, "-c", left], env={})
    server.start()
    server.wait()  # the leader is gone, its child lives on in the group
    stub = int(pid_file.read_text())
    assert _running(stub)  # else the test would be void
    server.kill()
    for _ in range(200):  # hang guard while the kill lands
        if not _running(stub):
            break
        time.sleep(0.05)
    assert not _running(stub)


def test_the_models_finalize_line_is_recognised_plain_and_json():
    # The stub exits right after this line, before tritonserver logs the unload: the launcher must not
    # take that exit for a crash.
    assert reports_model_finalized("2026-11-23 18:38:54,271 INFO tgi_llm.triton: model finalized")
    assert reports_model_finalized(
        '{"timestamp": "t", "level": "INFO", "fields": {"message": "model finalized"}, "target": "tgi_llm.triton"}')
    assert not reports_model_finalized("2026-11-23 18:38:54,271 INFO tgi_llm.triton: stopping the engine")
    assert not reports_model_finalized("2026-11-23 18:38:54,271 INFO someone.else: model finalized")


def test_finalize_line_sets_the_event():
    child = "print('2026-11-23 18:38:54,271 INFO tgi_llm.triton: model finalized', flush=True)"
    server = ServerProcess([sys.executable, "-c", child], env={})
    server.start()
    server.wait()  # joins the log pump
    assert server.model_finalized.is_set() and not server.model_unloaded.is_set()


def test_stopping_twice_is_one_graceful_stop_but_a_second_signal_kills(tmp_path):
    # Internal stops (giving up a start, a helper that died) may follow a user's stop signal: they must
    # not turn it into a kill. A second *signal* still kills, as the README says.
    marks, ready = tmp_path / "terms", tmp_path / "ready"
    child = (f"import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: open({str(marks)!r}, 'a').write('T'))\n"
             f"open({str(ready)!r}, 'w').close()\ntime.sleep(60)")
    server = ServerProcess([sys.executable, "-c", child], env={})
    server.start()
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:  # its handler is installed
            time.sleep(0.05)
        server.stop()
        server.stop()
        time.sleep(0.3)
        assert marks.read_text() == "T" and server.process.poll() is None
        server.request_stop()  # a second stop signal from the user
        assert server.wait() == -signal.SIGKILL
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.wait()
