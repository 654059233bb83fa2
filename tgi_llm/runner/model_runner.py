"""The model server half of a step: one forward over the flat batch, then per-request sampling.

`forward_plan` is all a shard rank runs; sampling and per-request state live only here, on rank 0.
"""

from __future__ import annotations

import ctypes
import logging
import platform

import torch

from tgi_llm.engine.runner_protocol import SeqResult
from tgi_llm.engine.sampling import PenaltyState, Sampler, make_generator, samples, uses_penalty
from tgi_llm.engine.sequence import Sequence
from tgi_llm.kv_cache import KVCache
from tgi_llm.runner.batch_inputs import StepPlan, plan_step, to_metadata

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit


def keep_freed_memory_in_heap() -> bool:
    """glibc hands large freed blocks straight back to the OS (munmap, heap trim), so every large activation
    of the next forward page-faults fresh zeroed pages: ~20% of a CPU prefill. Serve blocks up to 32 MiB
    from the heap and keep freed memory there (bounded by the forward's peak working set). Process-wide."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) and mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    return bool(ok)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: KVCache, block_size: int, vocab_size: int,
                 device: torch.device) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.penalties = PenaltyState(vocab_size, device)
        self.generators: dict[int, torch.Generator] = {}
        if device.type == "cpu" and keep_freed_memory_in_heap():
            logger.info("glibc malloc: large blocks kept in the heap (no page faults per forward)")

    def forward_plan(self, plan: StepPlan) -> torch.Tensor:
        """Logits [len(plan.logits_indices), V] (float32) for the rows the plan asks for."""
        dev = self.device
        attn = to_metadata(plan, self.block_size, dev)
        input_ids = torch.tensor(plan.input_ids, dtype=torch.long, device=dev)
        positions = torch.tensor(plan.positions, dtype=torch.long, device=dev)
        hidden = self.model(input_ids, positions, self.kv_caches, attn)
        rows = torch.tensor(plan.logits_indices, dtype=torch.long, device=dev)
        return self.model.compute_logits(hidden.index_select(0, rows))

    def execute(self, batch: list[Sequence]) -> list[SeqResult]:
        for seq in batch:
            if seq.is_prefill:
                self._admit(seq)
        plan = plan_step(batch)
        logits = self.forward_plan(plan)
        keys = [seq.request_id for seq in batch]
        params = [seq.request.sampling for seq in batch]
        top_n = max(seq.request.top_n_tokens for seq in batch)
        out = self.sampler(
            logits[: len(batch)], params, [self.generators.get(k) for k in keys],
            self.penalties.counts(keys) if len(self.penalties) else None, top_n,
        )
        self.penalties.record(keys, out.next_token_ids)
        prompt_lps = {i: self._prompt_logprobs(logits[off:off + n], batch[i]) for i, off, n in
                      plan.prompt_logprob_rows}
        # One host transfer for the whole batch.
        ids = out.next_token_ids.tolist()
        lps = out.logprobs.tolist()
        top_ids = out.top_token_ids.tolist() if out.top_token_ids is not None else None
        top_lps = out.top_logprobs.tolist() if out.top_logprobs is not None else None
        results = []
        for i, seq in enumerate(batch):
            n = seq.request.top_n_tokens
            results.append(SeqResult(
                token_id=ids[i], logprob=lps[i],
                top_ids=top_ids[i][:n] if top_ids and n else [],
                top_logprobs=top_lps[i][:n] if top_lps and n else [],
                prompt_logprobs=prompt_lps.get(i),
            ))
        return results

    def _admit(self, seq: Sequence) -> None:
        p = seq.request.sampling
        if samples(p):
            self.generators[seq.request_id] = make_generator(p.seed, self.device)
        if uses_penalty(p) and seq.request_id not in self.penalties:
            self.penalties.add(seq.request_id, seq.request.input_ids)

    @staticmethod
    def _prompt_logprobs(logits: torch.Tensor, seq: Sequence) -> list[float]:
        targets = torch.tensor(seq.request.input_ids[1:], dtype=torch.long, device=logits.device)
        return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1).tolist()

    def release(self, request_id: int) -> None:
        self.generators.pop(request_id, None)
        self.penalties.remove(request_id)

    def close(self) -> None:
        self.kv_caches = []
