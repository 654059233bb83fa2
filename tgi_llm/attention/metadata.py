"""The contract between the runner (which builds it each step) and the attention backends."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Describes one flattened, unpadded batch in which prefill and decode sequences mix.

    Sequence i owns query tokens `query_start_loc[i]:query_start_loc[i+1]` of the flat batch.
    Its context after this step is `seq_lens[i]` tokens: `seq_lens[i] - query_len` already in the
    KV cache plus the new ones, whose K/V the backend writes at `slot_mapping` first.
    """

    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset for every new token
    query_start_loc: torch.Tensor  # [B+1] int32: cumulative query lengths (cu_seqlens_q)
    seq_lens: torch.Tensor  # [B] int32: context length of each sequence after this step
    block_tables: torch.Tensor  # [B, max_blocks_per_seq] int32, rows padded with 0
    query_lens_cpu: list[int]  # host copies, so backends never sync to read shapes
    seq_lens_cpu: list[int]
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_cpu, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu, default=0)

    @property
    def is_pure_decode(self) -> bool:
        return self.max_query_len == 1
