"""The StepPlan as rank 0 sends it to the shards: only what changed since the last step, as int32s.

Both sides keep the same mirror of every live request (its KV blocks and how many of its tokens are
cached). A request the mirror already knows costs two ints per step plus the tokens it feeds (one for a
decode) and any newly allocated block ids; a request new to the mirror is sent whole (start position
and block table: prefix-cache hits arrive as blocks it did not compute). The shard decodes the very
StepPlan rank 0 built (tests check decode(encode(plan)) == plan), then both flatten it the same way.

Layout: [n_released, n_seqs, n_loads, released ids..., loads..., records...]. A load (an adapter to read
into a LoRA slot first): [slot, n_bytes, the path's UTF-8 bytes...]. Record of a known request:
[id, meta, (start,) (num_drafts,) (lora slot,) tokens..., new blocks...]; of a new one (FULL flag): [id,
meta, start, n_blocks, (num_drafts,) (lora slot,) tokens..., blocks...]. meta = flags | new_blocks << 7 |
n_tokens << 12. A known request whose start is not where the mirror left it (speculation: its rejected
draft tokens are not cached) sends its start (MOVED); a decode with drafts sends their number (DRAFTS); a
sequence running a LoRA adapter its slot (LORA). Ids are request ids modulo 2^31 (two live requests 2^31
ids apart cannot happen).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from tgi_llm.engine.step_plan import ScheduledSeq, StepPlan
from tgi_llm.lora.registry import LoraLoad

FULL = 1  # record carries the whole block table and the start position
PROMPT_LOGPROBS = 2  # the chunk's prompt rows' logits are wanted
SAMPLES = 4  # the step samples this sequence's next token
DECODE = 8  # the tokens fed follow a sampled one
DRAFTS = 16  # the number of draft tokens follows
MOVED = 32  # a known request's start follows (it is not where the mirror left it)
LORA = 64  # the LoRA slot of the sequence's adapter follows
_FLAG_BITS = 7
_ID_MASK = 0x7FFFFFFF
_MAX_DELTA_BLOCKS = 31  # what fits in meta's bits 7..11; more new blocks at once go as FULL
_TOKENS_SHIFT = 12


@dataclass
class _Mirror:
    blocks: list[int]
    num_tokens: int  # tokens whose K/V are in the cache after the last step sent


@dataclass
class PlanEncoder:
    """Rank 0's half: encode a plan against the mirror; `commit` once the message went out."""

    mirrors: dict[int, _Mirror] = field(default_factory=dict)
    _pending: list[tuple[int, _Mirror]] = field(default_factory=list)
    _pending_released: list[int] = field(default_factory=list)

    def encode(self, plan: StepPlan) -> torch.Tensor:
        released = [rid & _ID_MASK for rid in plan.released]
        out = [len(released), len(plan.seqs), len(plan.lora_loads), *released]
        for load in plan.lora_loads:
            path = load.path.encode()
            out += [load.slot, len(path), *path]
        self._pending = []
        self._pending_released = released
        for entry in plan.seqs:
            key = entry.request_id & _ID_MASK
            blocks = entry.block_ids
            flags = (PROMPT_LOGPROBS if entry.prompt_logprobs else 0) | (SAMPLES if entry.samples else 0) \
                | (DECODE if entry.is_decode else 0) | (DRAFTS if entry.num_drafts else 0) \
                | (LORA if entry.lora_slot >= 0 else 0)
            drafts = [entry.num_drafts] if entry.num_drafts else []
            drafts += [entry.lora_slot] if entry.lora_slot >= 0 else []
            n = len(entry.token_ids)
            known = self.mirrors.get(key) if key not in released else None
            if (known is not None and len(blocks) - len(known.blocks) <= _MAX_DELTA_BLOCKS
                    and blocks[: len(known.blocks)] == known.blocks):
                new = blocks[len(known.blocks):]
                moved = [entry.start] if known.num_tokens != entry.start else []
                flags |= MOVED if moved else 0
                out += [key, flags | len(new) << _FLAG_BITS | n << _TOKENS_SHIFT, *moved, *drafts, *entry.token_ids,
                        *new]
            else:
                out += [key, flags | FULL | n << _TOKENS_SHIFT, entry.start, len(blocks), *drafts, *entry.token_ids,
                        *blocks]
            self._pending.append((key, _Mirror(list(blocks), entry.end)))
        return torch.tensor(out, dtype=torch.int32)

    def commit(self) -> None:
        """The message was sent: the shards' mirrors now hold what this one will."""
        for key in self._pending_released:
            self.mirrors.pop(key, None)
        self.mirrors.update(self._pending)
        self._pending = []
        self._pending_released = []


@dataclass
class PlanDecoder:
    """A shard's half: apply a message to the mirror and rebuild rank 0's StepPlan."""

    mirrors: dict[int, _Mirror] = field(default_factory=dict)

    def decode(self, message: Iterable[int]) -> StepPlan:
        m = message.tolist() if isinstance(message, torch.Tensor) else list(message)
        n_released, n_seqs, n_loads = m[0], m[1], m[2]
        released = m[3: 3 + n_released]
        for key in released:
            self.mirrors.pop(key, None)
        i = 3 + n_released
        loads = []
        for _ in range(n_loads):
            slot, n = m[i], m[i + 1]
            loads.append(LoraLoad(slot, bytes(m[i + 2: i + 2 + n]).decode()))
            i += 2 + n
        seqs = []
        for _ in range(n_seqs):
            key, meta = m[i], m[i + 1]
            n_tokens = meta >> _TOKENS_SHIFT
            if meta & FULL:
                start, n_blocks = m[i + 2], m[i + 3]
                i += 4
                mirror = self.mirrors[key] = _Mirror([], start)
            else:
                n_blocks = (meta >> _FLAG_BITS) & _MAX_DELTA_BLOCKS
                i += 2
                mirror = self.mirrors[key]
                if meta & MOVED:
                    mirror.num_tokens = m[i]
                    i += 1
            num_drafts = m[i] if meta & DRAFTS else 0
            i += 1 if meta & DRAFTS else 0
            lora_slot = m[i] if meta & LORA else -1
            i += 1 if meta & LORA else 0
            tokens = m[i: i + n_tokens]
            mirror.blocks.extend(m[i + n_tokens: i + n_tokens + n_blocks])
            i += n_tokens + n_blocks
            seqs.append(ScheduledSeq(key, mirror.num_tokens, tokens, list(mirror.blocks), bool(meta & SAMPLES),
                                     bool(meta & PROMPT_LOGPROBS), is_decode=bool(meta & DECODE),
                                     num_drafts=num_drafts, lora_slot=lora_slot))
            mirror.num_tokens += n_tokens
        return StepPlan(seqs, released, loads)
