"""Helpers for the tensor-parallel tests: finding shard processes, a tiny model with text that splits by 3."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tgi_llm.procfs import cmdline, pid_alive

from ..conftest import TOKENIZER_FILES, _write_tiny_model

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


@pytest.fixture(scope="session")
def tiny_llama_by3_dir(tmp_path_factory, default_model_dir: Path) -> Path:
    """tiny_llama_dir with 6 heads and 3 KV heads (hidden 96, MLP 192): three ranks split it, and it has the
    default model's tokenizer (vocabulary 49152, also divisible by 3) for end-to-end text."""
    path = tmp_path_factory.mktemp("tiny-llama-by3")
    vocab = json.loads((default_model_dir / "config.json").read_text())["vocab_size"]
    _write_tiny_model(path, "llama", seed=0, vocab_size=vocab, hidden_size=96, num_attention_heads=6,
                      num_key_value_heads=3, intermediate_size=192)
    for name in (*TOKENIZER_FILES, "generation_config.json"):
        if (default_model_dir / name).is_file():
            shutil.copy(default_model_dir / name, path / name)
    return path
