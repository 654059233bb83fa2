"""--num-shard through the real server: tgi-llm-launcher -> tritonserver -> the Python-backend model, whose
stub process is rank 0 and spawns the shard ranks over MPI."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading

import pytest

from tests.integration.harness import START_TIMEOUT_S, grpc_generate, launch, wait_until
from tgi_llm import LLM
from tgi_llm.procfs import parent_pid, pid_alive

from .conftest import shard_pids_of_any_parent

pytestmark = pytest.mark.integration

LIMITS = ("--max-input-tokens", "64", "--max-total-tokens", "512", "--max-batch-total-tokens", "2048")
PROMPTS = ["Hello, my name is", "The capital of France is"]


def start(tmp_path, *flags: str):
    server = launch(tmp_path, *flags, *LIMITS)
    up = wait_until(lambda: server.ready() or server.process.poll() is not None, START_TIMEOUT_S, 0.5)
    if not (up and server.ready()):
        code = server.stop()
        pytest.fail(f"server not ready (exit {code}):\n{server.log_tail()}")
    return server


def test_two_shards_through_triton_give_the_greedy_text_of_one_and_stop_cleanly(tmp_path, tiny_llama_dir):
    before = set(shard_pids_of_any_parent())
    server = start(tmp_path, "--model-id", str(tiny_llama_dir), "--num-shard", "2", "--on-model-failure", "exit")
    try:
        ours = set(shard_pids_of_any_parent()) - before
        assert len(ours) == 2  # one shard rank: its guard and the shard process
        got = [grpc_generate(server, p, stream=False, max_tokens=16) for p in PROMPTS]
    finally:
        code = server.stop()
    assert code == 0, server.log_tail()
    with LLM(str(tiny_llama_dir), max_total_tokens=512) as one:
        want = [r.text for r in one.generate(PROMPTS, {"max_new_tokens": 16})]
    assert [g.error for g in got] == [None, None]
    assert [g.text for g in got] == want
    assert not any(pid_alive(p) for p in ours)


def test_killing_a_shard_under_triton_fails_every_stream_and_leaves_no_process(tmp_path, tiny_llama_dir):
    before = set(shard_pids_of_any_parent())
    server = start(tmp_path, "--model-id", str(tiny_llama_dir), "--num-shard", "2", "--on-model-failure", "exit")
    try:
        ours = set(shard_pids_of_any_parent()) - before
        started = threading.Barrier(4)
        replies = [None] * 3

        def stream(i: int) -> None:
            def on_response(reply) -> bool:
                if len(reply.texts) == 1:
                    started.wait()
                return False

            replies[i] = grpc_generate(server, f"Count to {i + 3}", max_tokens=400, ignore_eos=True,
                                       on_response=on_response)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        started.wait(timeout=START_TIMEOUT_S)  # every stream has its first token
        (shard,) = [p for p in ours if parent_pid(p) in ours]  # the guard's child
        os.kill(shard, signal.SIGKILL)
        for t in threads:
            t.join(timeout=START_TIMEOUT_S)
        assert all(r is not None and r.error is not None for r in replies), replies
        assert any("shard 1" in str(r.error) for r in replies), replies
        # The model takes itself out of service: not ready, and the launcher stops with an error (ShardFailed).
        assert wait_until(lambda: not server.ready(), START_TIMEOUT_S, 0.2), server.log_tail()
        assert wait_until(lambda: server.process.poll() is not None, START_TIMEOUT_S, 0.2), server.log_tail()
    finally:
        server.stop()
    assert server.process.returncode != 0
    log = server.log_path.read_text(errors="replace")
    assert "successfully unloaded 'tgi_llm'" in log and "ShardFailed" in log, server.log_tail()
    assert not any(pid_alive(p) for p in ours)


def test_three_ranks_on_a_hostfile_through_the_launcher_give_the_greedy_text_of_one(tmp_path, tiny_llama_by3_dir):
    """--shard-hosts through the real server: a hostfile naming this host twice (as two nodes would be named)
    reaches MPI_Comm_spawn from the model process; the ranks meet at this host's name, watch each other by
    heartbeat, and give one shard's tokens."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost:1\nlocalhost:1\n", encoding="utf-8")
    before = set(shard_pids_of_any_parent())
    server = start(tmp_path, "--model-id", str(tiny_llama_by3_dir), "--num-shard", "3", "--shard-hosts",
                   str(hostfile), "--on-model-failure", "exit")
    try:
        ours = set(shard_pids_of_any_parent()) - before
        assert len(ours) == 4  # two shard ranks: each a guard and the shard process
        got = [grpc_generate(server, p, stream=False, max_tokens=16) for p in PROMPTS]
    finally:
        code = server.stop()
    assert code == 0, server.log_tail()
    log = server.log_path.read_text(errors="replace")
    host = socket.gethostname()  # the default --shard-master-addr with --shard-hosts, and where both ranks ran
    assert re.search(rf"spawned 2 shard processes \(pids \[\d+, \d+\] on {host}, {host}\) for .*; rank 0's "
                     rf"store at {host}:\d+", log), server.log_tail()
    with LLM(str(tiny_llama_by3_dir), max_total_tokens=512) as one:
        want = [r.text for r in one.generate(PROMPTS, {"max_new_tokens": 16})]
    assert [g.error for g in got] == [None, None]
    assert [g.text for g in got] == want
    assert not any(pid_alive(p) for p in ours)


def test_two_shards_of_the_default_model_fail_start_up_naming_both_numbers(tmp_path, default_model_dir):
    server = launch(tmp_path, "--num-shard", "2", *LIMITS)
    try:
        server.process.wait(timeout=START_TIMEOUT_S)
    finally:
        server.stop()
    assert server.process.returncode != 0
    log = server.log_path.read_text(errors="replace")
    assert "num_attention_heads (9)" in log and "num_key_value_heads (3)" in log and "Given: 2" in log
