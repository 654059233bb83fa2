"""Baselines on the same requests: transformers' `generate` with static batches, and one request at a time.

Static batching (what serving looked like before continuous batching): requests are taken in order in
batches of `batch_size`, left-padded, and each batch runs until its longest member has its tokens;
tokens a shorter member generates past its own length are waste and are not counted. All requests
are there at t=0 (offline), so a request's TTFT includes waiting for the batches before it. One at a
time is the same with batch size 1: no padding, no waste, no batching.

Token times come from a logits processor, which transformers calls once per generation step. Exact
lengths come from a generation config without EOS, not from `min_new_tokens`: the processor behind that
costs milliseconds per step on the CPU, which would be charged to transformers, not to batching.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tgi_llm.bench.stats import RequestRecord, wall_time
from tgi_llm.bench.workload import BenchRequest


class _StepClock:
    """A LogitsProcessor that only records when each step's logits are ready."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.times.append(time.perf_counter())
        return scores


def load_hf_model(model_dir: Path, dtype: Any, device: Any) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()


def _greedy_config(model: Any, new_tokens: int, pad_id: int) -> Any:
    """Greedy, exactly `new_tokens` tokens: no EOS to stop at."""
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    config.max_new_tokens, config.min_new_tokens = new_tokens, None
    config.do_sample, config.pad_token_id = False, pad_id
    config.temperature = config.top_p = config.top_k = None  # greedy: silence the sampling-flag warnings
    return config


def run_static_batches(model: Any, requests: Sequence[BenchRequest], batch_size: int, pad_id: int,
                       progress: bool = True, desc: str = "") -> tuple[list[RequestRecord], float]:
    """Greedy generation of exactly each request's output length (members of a batch run to its longest)."""
    import torch
    from tqdm import tqdm
    from transformers import LogitsProcessorList

    device = next(model.parameters()).device
    records = [RequestRecord(r.index, r.input_len, r.output_len) for r in requests]
    batches = [list(range(i, min(i + batch_size, len(requests)))) for i in range(0, len(requests), batch_size)]
    bar = tqdm(total=len(requests), desc=desc or f"transformers batch {batch_size}", file=sys.stderr,
               disable=not progress, unit="req", leave=False)
    t0 = time.perf_counter()
    for record in records:
        record.start = t0
    try:
        with torch.inference_mode():
            for batch in batches:
                reqs = [requests[i] for i in batch]
                width = max(r.input_len for r in reqs)
                ids = torch.tensor([[pad_id] * (width - r.input_len) + list(r.input_ids) for r in reqs], device=device)
                mask = torch.tensor([[0] * (width - r.input_len) + [1] * r.input_len for r in reqs], device=device)
                new = max(r.output_len for r in reqs)
                clock = _StepClock()
                model.generate(ids, attention_mask=mask, generation_config=_greedy_config(model, new, pad_id),
                               logits_processor=LogitsProcessorList([clock]))
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                end = time.perf_counter()
                for i, r in zip(batch, reqs, strict=True):
                    records[i].token_times = clock.times[:r.output_len]
                    # A request's result is only handed back when its whole batch returns.
                    records[i].end = end
                    records[i].reported_output_tokens = len(records[i].token_times)
                bar.update(len(batch))
    finally:
        bar.close()
    return records, wall_time(records)


def warm_up(model: Any, pad_id: int) -> None:
    """One tiny generate, so the first measured batch does not pay for lazy initialisation."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([[pad_id, pad_id, pad_id]], device=device)
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=_greedy_config(model, 2, pad_id))
