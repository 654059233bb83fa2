"""The KV-cache blocks: who holds which, and which full blocks the prefix cache can hand out again.

A request gets, at admission, every block its whole life can fill (prompt + max_new_tokens - 1 slots,
as TGI v3 allocates: no preemption). Full blocks are keyed by a hash chained over their tokens
(block_hash.py). With prefix caching on:

- `allocate` first reuses the cached blocks that hold the longest prefix of the prompt (reference
  counted: any number of requests may read one block), then takes fresh ones;
- `cache_computed` registers each block of a request as soon as it is full and computed, prompt or
  generated tokens alike, so a concurrent request or the next chat turn can reuse it at once;
- `free` keeps registered blocks as they are: with no holder left they wait, least recently used
  first, until an allocation needs the space (blocks with nothing cached in them are handed out first).

Only full blocks are ever shared, and a request only writes past its cached prefix, so no shared block
is written. A prompt that is cached whole still computes its last block: the step needs the logits of
its last token.

Block states: held (reference count > 0), cached-free (count 0, registered: evictable), free (count 0,
nothing registered). held + cached-free + free == num_blocks at all times.

With `events` set (--kv-events-endpoint), every registration and every forgotten key is recorded there
(kv_events.py), so a router can rebuild the set of registered keys from the events alone.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Protocol

from tgi_llm.engine.block_hash import BlockHash, hash_block, hash_blocks
from tgi_llm.engine.kv_events import KVEventLog


class CacheableSequence(Protocol):
    """What the manager reads of a sequence."""

    request_id: int
    token_ids: list[int]
    num_computed: int

    @property
    def input_length(self) -> int: ...

    @property
    def cache_lookup(self) -> bool: ...

    @property
    def cache_key(self) -> bytes: ...

    @property
    def lora_name(self) -> str | None: ...


@dataclass
class _Table:
    blocks: list[int]
    #: Keys of the full blocks so far (chain order); blocks[:num_registered] went through registration.
    hashes: list[BlockHash] = field(default_factory=list)
    num_registered: int = 0


@dataclass
class PrefixCacheCounters:
    """Prompt tokens of admitted requests looked up in the prefix cache, and how many were found (vLLM's
    queries / hits). The scheduler counts: it alone knows when an admission is final."""

    queried_tokens: int = 0
    hit_tokens: int = 0


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.counters = PrefixCacheCounters()
        self._refs = [0] * num_blocks
        self._key_of: list[BlockHash | None] = [None] * num_blocks
        self._block_of: dict[BlockHash, int] = {}
        self._free: deque[int] = deque(range(num_blocks))  # nothing cached in them: handed out first
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, no holder: least recently used first
        self._tables: dict[int, _Table] = {}
        #: Where registrations and evictions are recorded for KV events (None: not published).
        self.events: KVEventLog | None = None

    # ---- state ----
    @property
    def num_free(self) -> int:
        """Blocks an allocation can take: free plus cached-free (evictable)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_free(self) -> int:
        return len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-max(num_tokens, 1) // self.block_size)

    def block_ids(self, seq: CacheableSequence) -> list[int]:
        """The sequence's block table (token i lives in block_ids[i // block_size]); do not modify."""
        return self._tables[seq.request_id].blocks

    def holds(self, seq: CacheableSequence) -> bool:
        return seq.request_id in self._tables

    # ---- allocation ----
    def allocate(self, seq: CacheableSequence, num_tokens: int) -> int | None:
        """Blocks for `num_tokens` slots of `seq`, reusing cached blocks of its prompt's prefix. Returns how
        many prompt tokens are cached already (a multiple of the block size, < the prompt's length), or
        None when too few blocks are free (then nothing is held)."""
        if seq.request_id in self._tables:
            raise RuntimeError(f"request {seq.request_id} already holds KV blocks")
        bs = self.block_size
        prompt = seq.token_ids[: seq.input_length]
        hashes = hash_blocks(prompt, bs, len(prompt) // bs, extra_key=seq.cache_key) \
            if self.enable_prefix_caching else []
        hits: list[int] = []
        if hashes and seq.cache_lookup:
            for key in hashes[: (len(prompt) - 1) // bs]:  # the last prompt token is always computed
                block = self._block_of.get(key)
                if block is None:
                    break
                hits.append(block)
        needed = self.blocks_for(num_tokens) - len(hits)
        available = len(self._free) + len(self._evictable) - sum(1 for b in hits if self._refs[b] == 0)
        if needed > available:
            return None
        for block in hits:
            self._hold(block)
        blocks = hits + [self._take_fresh() for _ in range(needed)]
        self._tables[seq.request_id] = _Table(blocks, hashes, num_registered=len(hits))
        return len(hits) * bs

    def cache_computed(self, seq: CacheableSequence) -> None:
        """Register the sequence's blocks that are now full and computed (call after every step)."""
        if not self.enable_prefix_caching:
            return
        table = self._tables[seq.request_id]
        full = min(seq.num_computed // self.block_size, len(table.blocks))
        if full <= table.num_registered:
            return
        bs = self.block_size
        while len(table.hashes) < full:  # generated tokens: extend the chain
            i = len(table.hashes)
            parent = table.hashes[-1] if table.hashes else None
            table.hashes.append(hash_block(parent, seq.token_ids[i * bs : (i + 1) * bs], seq.cache_key))
        run_start = None  # the first of the consecutive blocks registered just now (one event for them)
        for i in range(table.num_registered, full):
            key, block = table.hashes[i], table.blocks[i]
            if key not in self._block_of and self._key_of[block] is None:
                self._block_of[key] = block
                self._key_of[block] = key
                run_start = i if run_start is None else run_start
                continue
            # Another block holds these tokens already (two requests prefilled the same prompt at once);
            # this one stays private and is simply freed later.
            self._record_stored(seq, table, run_start, i)
            run_start = None
        self._record_stored(seq, table, run_start, full)
        table.num_registered = full

    def _record_stored(self, seq: CacheableSequence, table: _Table, start: int | None, end: int) -> None:
        if self.events is None or start is None:
            return
        bs = self.block_size
        self.events.stored(table.hashes[start:end], table.hashes[start - 1] if start else None,
                           seq.token_ids[start * bs : end * bs], seq.lora_name)

    def free(self, seq: CacheableSequence) -> None:
        table = self._tables.pop(seq.request_id, None)
        if table is None:
            return
        # The chain's tail first: with the same age, a child block is evicted before its parent.
        for block in reversed(table.blocks):
            if self._refs[block] <= 0:
                raise RuntimeError(f"KV block {block} freed twice")
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if self._key_of[block] is not None:
                    self._evictable[block] = None
                else:
                    self._free.append(block)

    def reset_prefix_cache(self) -> int:
        """Forget every cached block no request holds; returns how many were dropped."""
        dropped = list(self._evictable)
        self._evictable.clear()
        for block in dropped:
            self._forget(block)
            self._free.append(block)
        return len(dropped)

    # ---- internals ----
    def _hold(self, block: int) -> None:
        if self._refs[block] == 0:
            del self._evictable[block]
        self._refs[block] += 1

    def _take_fresh(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._evictable.popitem(last=False)  # least recently used
            self._forget(block)
        self._refs[block] = 1
        return block

    def _forget(self, block: int) -> None:
        key = self._key_of[block]
        if key is not None:
            self._key_of[block] = None
            if self._block_of.get(key) == block:
                del self._block_of[key]
                if self.events is not None:
                    self.events.removed(key)

    def check(self) -> None:
        """Every invariant, from scratch (tests call this; O(num_blocks))."""
        holders = [0] * self.num_blocks
        for table in self._tables.values():
            for block in table.blocks:
                holders[block] += 1
        assert holders == self._refs, "reference counts differ from the holders"
        free, evictable = set(self._free), set(self._evictable)
        assert len(free) == len(self._free) and not free & evictable
        assert all(self._refs[b] == 0 and self._key_of[b] is None for b in free)
        assert all(self._refs[b] == 0 and self._key_of[b] is not None for b in evictable)
        held = sum(1 for r in self._refs if r > 0)
        assert held + len(free) + len(evictable) == self.num_blocks
        assert all(self._key_of[b] == k for k, b in self._block_of.items())
        assert sum(1 for k in self._key_of if k is not None) == len(self._block_of)
