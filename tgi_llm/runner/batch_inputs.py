"""A StepPlan as one unpadded forward batch: every rank flattens the same plan the same way."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tgi_llm.attention.metadata import AttentionMetadata
from tgi_llm.engine.step_plan import StepPlan


@dataclass
class BatchInputs:
    """Plain lists, turned into tensors by `to_metadata` and the runner."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    #: Rows of the flat batch whose logits are needed: the sampled rows of every sampling sequence (its
    #: last 1 + num_drafts rows, in plan order), then the prompt rows of sequences that asked for prompt
    #: logprobs.
    logits_indices: list[int]
    #: Plan index of each sampling sequence, in the order of their logits rows.
    sample_seqs: list[int]
    #: For each sequence with prompt rows: (plan index, first logits row, number of rows).
    prompt_logprob_rows: list[tuple[int, int, int]]
    #: Each row's LoRA slot (-1: the base model).
    lora_slots: list[int]


def flatten(plan: StepPlan, block_size: int) -> BatchInputs:
    out = BatchInputs([], [], [], [], [], [], [], [], [], [])
    prompt_rows: list[tuple[int, int, int]] = []  # (plan index, first flat row, rows)
    for i, entry in enumerate(plan.seqs):
        start, end, table = entry.start, entry.end, entry.block_ids
        row0 = len(out.input_ids)
        out.input_ids.extend(entry.token_ids)
        out.lora_slots.extend([entry.lora_slot] * entry.num_tokens)
        out.positions.extend(range(start, end))
        out.slot_mapping.extend(table[p // block_size] * block_size + p % block_size for p in range(start, end))
        out.query_lens.append(end - start)
        out.seq_lens.append(end)
        out.block_tables.append(table)
        if entry.samples:
            out.logits_indices.extend(range(len(out.input_ids) - entry.num_sampled_rows, len(out.input_ids)))
            out.sample_seqs.append(i)
        rows = entry.num_tokens - (1 if entry.samples else 0)  # the sampled row predicts no prompt token
        if entry.prompt_logprobs and rows > 0:
            prompt_rows.append((i, row0, rows))
    for i, row0, rows in prompt_rows:
        out.prompt_logprob_rows.append((i, len(out.logits_indices), rows))
        out.logits_indices.extend(range(row0, row0 + rows))
    return out


def num_sample_rows(plan: StepPlan, batch: BatchInputs) -> int:
    """How many leading logits rows are sampled rows."""
    return sum(plan.seqs[i].num_sampled_rows for i in batch.sample_seqs)


def to_metadata(batch: BatchInputs, block_size: int, device: torch.device) -> AttentionMetadata:
    width = max((len(t) for t in batch.block_tables), default=0)
    tables = torch.zeros((len(batch.block_tables), max(width, 1)), dtype=torch.int32)
    for i, t in enumerate(batch.block_tables):
        if t:
            tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    qsl = [0]
    for q in batch.query_lens:
        qsl.append(qsl[-1] + q)
    return AttentionMetadata(
        slot_mapping=torch.tensor(batch.slot_mapping, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(batch.seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        query_lens_cpu=list(batch.query_lens),
        seq_lens_cpu=list(batch.seq_lens),
        block_size=block_size,
    )
