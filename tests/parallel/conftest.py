"""Helpers for the tensor-parallel tests: finding shard processes."""

from __future__ import annotations

import os

import torch

from tgi_llm.procfs import cmdline, pid_alive

torch.set_num_threads(1)  # the shard ranks share the machine's cores with this process


def _live_shard_processes(parent_pid: int | None) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and pid_alive(int(name)):
            argv = cmdline(int(name))
            if "tgi_llm.parallel.shard_main" in argv and (parent_pid is None or f"--parent={parent_pid}" in argv):
                found.append(int(name))
    return found


def shard_pids(parent_pid: int | None = None) -> list[int]:
    """Live (non-zombie) shard processes spawned by `parent_pid` (default: this process)."""
    return _live_shard_processes(parent_pid or os.getpid())


def shard_pids_of_any_parent() -> list[int]:
    """Every live shard process on the machine (guards included), whoever spawned it."""
    return _live_shard_processes(None)
