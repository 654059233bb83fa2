"""torch.distributed among the ranks: the default group for the model's collectives, a gloo group for
the step plan, and the small channel that carries one plan per step."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

STEP, STOP, SETUP = 1, 2, 3
#: An idle shard waits for the next plan this long; rank 0 going away ends the wait sooner (the socket
#: closes), so this only bounds a rank 0 that is alive but never speaks again. Rank 0's own side of the
#: plan group uses the collective timeout: a gloo send waits for the receiver, and a hung shard must
#: fail the step, not hold it for days. (Gloo timeouts are per process, so the two sides may differ.)
IDLE_TIMEOUT = timedelta(days=7)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_groups(store: dist.Store, rank: int, world_size: int, device: torch.device,
                collective_timeout_s: float, loopback: bool = True) -> dist.ProcessGroup:
    """Join the default group (the model's all-reduces, with a timeout so that a hung shard fails the
    step instead of hanging it) and return the plan group. Every rank calls this in the same order.
    `loopback`: every rank is on this host (no --shard-hosts)."""
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialized in this process: one sharded model "
                           "per process")
    if loopback:
        # Ranks all live on this host (MPI spawns them here): keep gloo off whatever interface the
        # hostname resolves to. Across hosts gloo takes GLOO_SOCKET_IFNAME from the environment (hydra
        # passes rank 0's on), else the address the host name resolves to.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    step_timeout = timedelta(seconds=collective_timeout_s)
    dist.init_process_group(backend_for(device), store=dist.PrefixStore("tgi/pg", store), rank=rank,
                            world_size=world_size, timeout=step_timeout,
                            device_id=device if device.type == "cuda" else None)
    return dist.new_group(backend="gloo", timeout=step_timeout if rank == 0 else IDLE_TIMEOUT)


def destroy_groups() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclass
class PlanChannel:
    """Rank 0 -> every shard: a 2-int header (op, length), then `length` int32s. Two gloo broadcasts of
    a few hundred bytes per step; the payload is `plan_codec`'s delta."""

    group: dist.ProcessGroup

    def send(self, op: int, payload: torch.Tensor | None = None) -> None:
        n = 0 if payload is None else payload.numel()
        dist.broadcast(torch.tensor([op, n], dtype=torch.int64), src=0, group=self.group)
        if n:
            dist.broadcast(payload, src=0, group=self.group)

    def recv(self) -> tuple[int, torch.Tensor]:
        header = torch.empty(2, dtype=torch.int64)
        dist.broadcast(header, src=0, group=self.group)
        op, n = header.tolist()
        payload = torch.empty(n, dtype=torch.int32)
        if n:
            dist.broadcast(payload, src=0, group=self.group)
        return op, payload
