"""ShardedModelRunner: rank 0's runner. Same protocol as ModelRunner; each forward first sends the step
plan to the shards, then runs the model (whose collectives the shards join); sampling stays here."""

from __future__ import annotations

import torch

from tgi_llm.engine.step_plan import StepPlan
from tgi_llm.kv_cache import KVCache
from tgi_llm.parallel.comm import STEP
from tgi_llm.parallel.launch import ShardGroup
from tgi_llm.parallel.plan_codec import PlanEncoder
from tgi_llm.runner.batch_inputs import BatchInputs
from tgi_llm.runner.model_runner import ModelRunner


class ShardFailure(BaseException):  # noqa: N818 (named for what happened, like KeyboardInterrupt)
    """A shard died or a collective failed: every later forward would fail or hang too.

    A BaseException on purpose: the engine turns an ordinary exception from `execute` into an error for
    that batch only and carries on, but this one must take its loop down, which fails every request in
    flight and marks the engine unhealthy."""


class ShardedModelRunner(ModelRunner):
    def __init__(self, group: ShardGroup, model: torch.nn.Module, kv_caches: KVCache, block_size: int,
                 vocab_size: int, device: torch.device, eos_token_ids: frozenset[int] = frozenset()) -> None:
        super().__init__(model, kv_caches, block_size, vocab_size, device, eos_token_ids)
        self.group = group
        self.encoder = PlanEncoder()
        group.connect(num_blocks=kv_caches[0][0].shape[0], block_size=block_size)

    def forward_plan(self, plan: StepPlan) -> tuple[BatchInputs, torch.Tensor]:
        """Send the plan to the shards, then run this rank's part of the forward with them."""
        if self.group.failure is not None:
            raise ShardFailure(self.group.failure)
        message = self.encoder.encode(plan)
        try:
            self.group.channel.send(STEP, message)
            self.encoder.commit()
            return super().forward_plan(plan)
        except Exception as exc:  # once one rank fails mid-step the ranks' collectives are out of step
            raise ShardFailure(self.group.fail(f"sharded forward failed: {exc}")) from exc

    def close(self) -> None:
        super().close()
        self.group.stop()
