"""Tensor parallelism: shard ranks spawned over MPI, Megatron-split layers, the step plan broadcast.

Nothing here is imported for one shard (the default), which runs in-process with no MPI at all. See
docs/SHARDING.md. Importing this package does not import MPI either: `launch._spawn` does, lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tgi_llm.parallel.launch import ShardGroup
    from tgi_llm.parallel.runner import ShardedModelRunner, ShardFailure

__all__ = ["ShardGroup", "ShardedModelRunner", "ShardFailure"]


def __getattr__(name: str):
    if name == "ShardGroup":
        from tgi_llm.parallel.launch import ShardGroup

        return ShardGroup
    if name in ("ShardedModelRunner", "ShardFailure"):
        from tgi_llm.parallel import runner

        return getattr(runner, name)
    raise AttributeError(name)
