"""The launcher end to end: TGI's start-up errors, and a model that fails to load inside tritonserver."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_launcher(*flags: str, env: dict[str, str] | None = None, timeout: float = 600.0) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env or {}), PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "tgi_llm.launcher.main", *flags], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)


def test_rejects_max_input_tokens_not_below_max_total_tokens():
    done = run_launcher("--max-input-tokens", "2048", "--max-total-tokens", "1024")
    assert done.returncode == 1
    assert 'Error: ArgumentValidation("`max_input_tokens`(2048) must be < `max_total_tokens`(1024)")' in done.stderr


def test_rejects_an_environment_combination_too():
    done = run_launcher(env={"MAX_BATCH_PREFILL_TOKENS": "100", "MAX_INPUT_TOKENS": "200", "MAX_TOTAL_TOKENS": "300",
                             "PREFILL_CHUNKING": "0"})  # with chunking, the prefill budget is a step's only
    assert done.returncode == 1
    assert "`max_batch_prefill_tokens` must be >= `max_input_tokens`. Given: 100 and 200" in done.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    done = run_launcher("--model-id", str(tmp_path / "nope.gguf"))
    assert done.returncode == 1
    assert "could not prepare the weights" in done.stderr and "nope.gguf" in done.stderr


@pytest.mark.integration
def test_model_that_fails_to_load_stops_the_launcher_with_a_clear_message(tmp_path):
    from tests.integration.harness import free_ports

    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')  # no weights, no tokenizer
    http, grpc, metrics = free_ports(3)
    done = run_launcher("--model-id", str(broken), "--hostname", "127.0.0.1", "--http-port", str(http),
                        "--grpc-port", str(grpc), "--metrics-port", str(metrics),
                        "--max-batch-total-tokens", "4096", "--max-total-tokens", "1024")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "before model `tgi_llm` was ready: the model failed to load: " in done.stderr  # with the reason


@pytest.mark.integration
def test_model_process_killed_stops_the_launcher_within_10_s_with_on_model_failure_exit(tmp_path, tiny_llama_dir):
    # TGI's behaviour (ShardFailed, exit 1) for an orchestrator to restart; the default restarts instead
    # (tests/integration/test_model_failure.py).
    import signal
    import time

    from tests.integration.harness import START_TIMEOUT_S, launch, wait_until
    from tgi_llm.launcher.process import runs_instance_of
    from tgi_llm.launcher.shm import SHM_DIR
    from tgi_llm.procfs import children, cmdline, pid_alive

    server = launch(tmp_path, "--model-id", str(tiny_llama_dir), "--max-batch-total-tokens", "4096",
                    "--max-input-tokens", "256", "--max-total-tokens", "512", "--on-model-failure", "exit")
    try:
        # the launcher's own Ready line: from then on it watches the model's process
        assert wait_until(lambda: "INFO tgi_llm.launcher: Ready:" in server.log_path.read_text(), START_TIMEOUT_S)
        (triton,) = [p for p in children(server.process.pid) if cmdline(p)[0].endswith("tritonserver")]
        stubs = [p for p in children(triton) if runs_instance_of(cmdline(p), "tgi_llm")]  # not tgi_llm_trtllm's
        assert len(stubs) == 1, stubs
        region = cmdline(stubs[0])[2]
        os.kill(stubs[0], signal.SIGKILL)
        killed = time.monotonic()
        assert server.process.wait(120) == 1  # hang guard
        assert time.monotonic() - killed < 10
        log = server.log_path.read_text()
        assert "ShardFailed" in log and f"pid {stubs[0]}) died" in log, server.log_tail()
        assert not pid_alive(triton)
        assert not (SHM_DIR / region).exists()  # the dead stub's shared memory went with it
    finally:
        server.stop()
