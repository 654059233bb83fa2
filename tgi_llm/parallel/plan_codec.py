"""The step plan as rank 0 sends it to the shards: only what changed since the last step, as int32s.

Both sides keep the same mirror of every live request (its KV blocks and how many of its tokens are
cached). A request the mirror already knows costs three ints for a decode step (id, packed counts, the
new token) plus any newly allocated block ids; a new (or preempted and restarted) request is sent
whole. Slots, positions, sequence lengths and logits rows are derived, never sent, so the shard
rebuilds exactly the `StepPlan` that `plan_step` builds on rank 0 (tests check the two match).

Layout: [n_released, n_seqs, released ids..., records...]. Record of a known request:
[id, meta, tokens..., new blocks...] with meta = flags | new_blocks << 2 | n_tokens << 8.
Record of a new one (FULL flag): [id, meta, start, n_blocks, tokens..., blocks...].
Ids are request ids modulo 2^31 (two live requests 2^31 ids apart cannot happen).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from tgi_llm.engine.sequence import Sequence
from tgi_llm.runner.batch_inputs import StepPlan

FULL = 1  # record carries the whole block table and the start position
PROMPT_LOGPROBS = 2  # the sequence wants logits for every prompt token
_ID_MASK = 0x7FFFFFFF
_MAX_DELTA_BLOCKS = 63  # what fits in meta's bits 2..7; more new blocks at once go as FULL


@dataclass
class _Mirror:
    blocks: list[int]
    num_tokens: int  # tokens whose K/V are in the cache after the last step sent


@dataclass
class PlanEncoder:
    """Rank 0's half: encode a batch against the mirror; `commit` once the message went out."""

    mirrors: dict[int, _Mirror] = field(default_factory=dict)
    _released: list[int] = field(default_factory=list)
    _pending: list[tuple[int, _Mirror]] = field(default_factory=list)

    def release(self, request_id: int) -> None:
        key = request_id & _ID_MASK
        if self.mirrors.pop(key, None) is not None:
            self._released.append(key)

    def encode(self, batch: list[Sequence]) -> torch.Tensor:
        out = [len(self._released), len(batch), *self._released]
        self._pending = []
        for seq in batch:
            assert seq.allocation is not None, f"request {seq.request_id} runs without KV blocks"
            key = seq.request_id & _ID_MASK
            start, end = seq.num_computed, len(seq.token_ids)
            blocks = seq.allocation.blocks
            flags = PROMPT_LOGPROBS if start == 0 and seq.request.decoder_input_details and end > 1 else 0
            tokens = seq.token_ids[start:end]
            known = self.mirrors.get(key)
            if (known is not None and known.num_tokens == start and len(blocks) - len(known.blocks)
                    <= _MAX_DELTA_BLOCKS and blocks[: len(known.blocks)] == known.blocks):
                new = blocks[len(known.blocks):]
                out += [key, flags | len(new) << 2 | len(tokens) << 8, *tokens, *new]
            else:
                out += [key, flags | FULL | len(tokens) << 8, start, len(blocks), *tokens, *blocks]
            self._pending.append((key, _Mirror(list(blocks), end)))
        return torch.tensor(out, dtype=torch.int32)

    def commit(self) -> None:
        """The message was sent: the shards' mirrors now hold what this one will."""
        self.mirrors.update(self._pending)
        self._pending = []
        self._released = []


@dataclass
class PlanDecoder:
    """A shard's half: apply a message to the mirror and rebuild rank 0's StepPlan."""

    block_size: int
    mirrors: dict[int, _Mirror] = field(default_factory=dict)

    def decode(self, message: Iterable[int]) -> StepPlan:
        m = message.tolist() if isinstance(message, torch.Tensor) else list(message)
        n_released, n_seqs = m[0], m[1]
        for key in m[2: 2 + n_released]:
            self.mirrors.pop(key, None)
        i = 2 + n_released
        bs = self.block_size
        plan = StepPlan([], [], [], [], [], [], [], [])
        last_rows: list[int] = []
        prompt_rows: list[tuple[int, int, int]] = []
        for s in range(n_seqs):
            key, meta = m[i], m[i + 1]
            n_tokens = meta >> 8
            if meta & FULL:
                start, n_blocks = m[i + 2], m[i + 3]
                i += 4
                tokens = m[i: i + n_tokens]
                blocks = m[i + n_tokens: i + n_tokens + n_blocks]
                mirror = self.mirrors[key] = _Mirror(blocks, start)
            else:
                n_blocks = (meta >> 2) & _MAX_DELTA_BLOCKS
                i += 2
                tokens = m[i: i + n_tokens]
                mirror = self.mirrors[key]
                mirror.blocks.extend(m[i + n_tokens: i + n_tokens + n_blocks])
            i += n_tokens + n_blocks
            start, end = mirror.num_tokens, mirror.num_tokens + n_tokens
            row0 = len(plan.input_ids)
            plan.input_ids.extend(tokens)
            plan.positions.extend(range(start, end))
            table = mirror.blocks
            plan.slot_mapping.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            plan.query_lens.append(n_tokens)
            plan.seq_lens.append(end)
            plan.block_tables.append(list(table))
            last_rows.append(len(plan.input_ids) - 1)
            if meta & PROMPT_LOGPROBS:
                prompt_rows.append((s, row0, end - 1))
            mirror.num_tokens = end
        # Same row order as plan_step: last tokens first, then every prompt-logprob row.
        offset = len(last_rows)
        plan.logits_indices = last_rows + [r for _, row0, n in prompt_rows for r in range(row0, row0 + n)]
        for s, _, n in prompt_rows:
            plan.prompt_logprob_rows.append((s, offset, n))
            offset += n
        return plan
