"""ServerProcess against a stand-in child that prints tritonserver-like log lines."""

from __future__ import annotations

import socket
import sys

from tgi_llm.launcher.process import ServerProcess, load_failure

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


def test_load_failure_reason_is_quoted_from_the_log():
    line = "E1122 failed to load 'tgi_llm' version 1: Internal: ValueError: bad config\\nmore"
    assert load_failure(line) == "Internal: ValueError: bad config"
    assert load_failure(UNLOAD_LINE) is None
