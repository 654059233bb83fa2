"""Flatten a list of sequences into one unpadded forward batch (the step plan's tensors)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tgi_llm.attention.metadata import AttentionMetadata
from tgi_llm.engine.sequence import Sequence


@dataclass
class StepPlan:
    """Plain lists: what rank 0 would send to shard ranks, and what tensors are built from."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    #: Rows of the flat batch whose logits are needed: the last token of each sequence, then
    #: every prompt token of sequences that asked for prompt logprobs.
    logits_indices: list[int]
    #: For each sequence asking for prompt logprobs: (sequence index, first row, number of rows).
    prompt_logprob_rows: list[tuple[int, int, int]]


def plan_step(batch: list[Sequence]) -> StepPlan:
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_lens: list[int] = []
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    last_rows: list[int] = []
    prompt_rows: list[tuple[int, int, int]] = []
    for i, seq in enumerate(batch):
        assert seq.allocation is not None, f"request {seq.request_id} runs without KV blocks"
        start, end = seq.num_computed, len(seq.token_ids)
        row0 = len(input_ids)
        input_ids.extend(seq.token_ids[start:end])
        positions.extend(range(start, end))
        slots.extend(seq.allocation.slots(start, end))
        query_lens.append(end - start)
        seq_lens.append(end)
        tables.append(seq.allocation.blocks)
        last_rows.append(len(input_ids) - 1)
        if start == 0 and seq.request.decoder_input_details and end > 1:
            prompt_rows.append((i, row0, end - 1))
    extra = [r for _, row0, n in prompt_rows for r in range(row0, row0 + n)]
    # Re-express prompt rows as offsets into logits_indices.
    offset = len(last_rows)
    remapped = []
    for i, _, n in prompt_rows:
        remapped.append((i, offset, n))
        offset += n
    return StepPlan(input_ids, positions, slots, query_lens, seq_lens, tables, last_rows + extra, remapped)


def to_metadata(plan: StepPlan, block_size: int, device: torch.device) -> AttentionMetadata:
    width = max((len(t) for t in plan.block_tables), default=0)
    tables = torch.zeros((len(plan.block_tables), max(width, 1)), dtype=torch.int32)
    for i, t in enumerate(plan.block_tables):
        if t:
            tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    qsl = [0]
    for q in plan.query_lens:
        qsl.append(qsl[-1] + q)
    return AttentionMetadata(
        slot_mapping=torch.tensor(plan.slot_mapping, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(plan.seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        query_lens_cpu=list(plan.query_lens),
        seq_lens_cpu=list(plan.seq_lens),
        block_size=block_size,
    )
