"""Helpers for the tensor-parallel tests: sequences without an engine, and finding shard processes."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tgi_llm.engine.block_allocator import BlockAllocator
from tgi_llm.engine.sequence import Sequence
from tgi_llm.request import SamplingParams, StoppingParams, ValidRequest

torch.set_num_threads(1)  # the shard ranks share the machine's cores with this process


def make_seq(request_id: int, prompt: list[int], allocator: BlockAllocator, max_new_tokens: int = 4,
             decoder_input_details: bool = False) -> Sequence:
    request = ValidRequest(tuple(prompt), SamplingParams(), StoppingParams(max_new_tokens),
                           decoder_input_details=decoder_input_details)
    seq = Sequence(request_id, request, lambda _event: None)
    seq.allocation = allocator.allocate(len(prompt) + max_new_tokens - 1)
    assert seq.allocation is not None
    return seq


def shard_pids(parent_pid: int | None = None) -> list[int]:
    """Live (non-zombie) shard processes spawned by `parent_pid` (default: this process)."""
    tag = f"--parent={parent_pid or os.getpid()}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if b"tgi_llm.parallel.shard_main" in cmdline and tag in cmdline and state not in ("Z", "X"):
            found.append(int(proc.name))
    return found


def shard_pids_of_any_parent() -> list[int]:
    """Every live shard process on the machine (guards included), whoever spawned it."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if b"tgi_llm.parallel.shard_main" in cmdline and state not in ("Z", "X"):
            found.append(int(proc.name))
    return found


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
