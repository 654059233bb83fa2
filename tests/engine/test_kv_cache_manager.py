"""The KV-cache manager: reference counts, prefix-cache hits, LRU eviction, and a property test of every
invariant over 100k random operations."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from tgi_llm.engine.kv_cache_manager import KVCacheManager, _Table


@dataclass(eq=False)
class Seq:
    request_id: int
    token_ids: list[int]
    prompt_len: int
    num_computed: int = 0
    cache_lookup: bool = True
    cache_key: bytes = b""
    capacity: int = 0
    lora_name: str | None = None

    @property
    def input_length(self) -> int:
        return self.prompt_len


_ids = iter(range(1, 10**9))


def seq(tokens: list[int], **kw) -> Seq:
    return Seq(next(_ids), list(tokens), len(tokens), **kw)


def compute_all(kv: KVCacheManager, s: Seq) -> None:
    s.num_computed = len(s.token_ids)
    kv.cache_computed(s)


def test_allocates_enough_blocks_and_refuses_without_taking_anything():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = seq(list(range(9)))
    assert kv.allocate(a, 9) == 0 and len(kv.block_ids(a)) == 3 and kv.num_free == 7
    b = seq(list(range(100, 130)))
    assert kv.allocate(b, 30) is None and kv.num_free == 7 and not kv.holds(b)
    kv.free(a)
    assert kv.num_free == 10
    kv.check()


def test_a_prefix_is_shared_between_concurrent_requests_once_computed():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    system = list(range(50, 62))  # 3 full blocks
    a = seq(system + [1, 2])
    assert kv.allocate(a, 20) == 0
    b_early = seq(system + [3])
    assert kv.allocate(b_early, 8) == 0  # a's blocks are not computed yet: nothing to share
    compute_all(kv, a)
    b = seq(system + [4, 5, 6])
    assert kv.allocate(b, 16) == 12
    assert kv.block_ids(b)[:3] == kv.block_ids(a)[:3]
    kv.free(a)
    assert kv.num_cached_free == 0  # b still holds the shared blocks; a's private tail block is not full
    kv.check()


def test_freed_cached_blocks_are_evicted_least_recently_used_and_only_when_needed():
    kv = KVCacheManager(num_blocks=5, block_size=2)
    old, new = seq([1, 2, 3]), seq([7, 8, 9])
    for s in (old, new):  # each leaves one full, cached block and one partial block
        kv.allocate(s, 3)
        compute_all(kv, s)
        kv.free(s)
    assert kv.num_cached_free == 2 and kv.num_free == 5
    filler = seq([20, 21])
    kv.allocate(filler, 6)  # three blocks: exactly the ones with nothing cached
    assert kv.num_cached_free == 2
    kv.free(filler)
    big = seq([30, 31, 32, 33])
    kv.allocate(big, 8)  # four blocks: the three uncached ones, then the least recently used cached one
    assert kv.num_cached_free == 1
    kv.free(big)
    assert kv.allocate(seq([1, 2, 3]), 3) == 0  # `old`'s block was evicted
    assert kv.allocate(seq([7, 8, 9]), 3) == 2  # `new`'s survived
    kv.check()


def test_hits_are_counted_only_by_the_scheduler_and_reset_drops_the_cache():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = seq(list(range(9)))
    kv.allocate(a, 9)
    compute_all(kv, a)
    kv.free(a)
    assert kv.counters.queried_tokens == 0
    assert kv.reset_prefix_cache() == 2 and kv.num_cached_free == 0
    assert kv.allocate(seq(list(range(9))), 9) == 0
    kv.check()


def test_a_double_free_of_a_block_is_caught():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = seq([1, 2])
    kv.allocate(a, 2)
    block = kv.block_ids(a)[0]
    kv.free(a)
    kv._tables[a.request_id] = _Table([block])  # a stale table naming a block nobody holds
    with pytest.raises(RuntimeError, match="freed twice"):
        kv.free(a)


@dataclass
class World:
    """What the property test knows independently of the manager: the context each block was computed
    for, so every hit can be checked to hand out exactly the K/V of the same tokens."""

    kv: KVCacheManager
    rng: random.Random
    live: list[Seq] = field(default_factory=list)
    written: dict[int, tuple[int, ...]] = field(default_factory=dict)
    prefixes: list[list[int]] = field(default_factory=list)
    hit_blocks: int = 0

    def compute(self, s: Seq, n: int) -> None:
        bs = self.kv.block_size
        table = self.kv.block_ids(s)
        for pos in range(s.num_computed, s.num_computed + n):
            block = table[pos // bs]
            assert self.kv._refs[block] == 1, "a shared block was written"  # noqa: SLF001
            if pos % bs == bs - 1:
                self.written[block] = tuple(s.token_ids[: pos + 1])
            else:
                self.written.pop(block, None)
        s.num_computed += n
        self.kv.cache_computed(s)

    def allocate(self) -> None:
        bs = self.kv.block_size
        base = self.rng.choice(self.prefixes)
        tail = [self.rng.randrange(50) for _ in range(self.rng.randint(0, 9))]
        prompt = base[: self.rng.randint(1, len(base))] + tail
        s = seq(prompt, cache_lookup=self.rng.random() > 0.1, cache_key=self.rng.choice([b"", b"", b"", b"lora"]))
        s.capacity = len(prompt) + self.rng.randint(0, 12)
        cached = self.kv.allocate(s, s.capacity)
        if cached is None:
            return
        assert cached % bs == 0 and cached < len(prompt) and (cached == 0 or s.cache_lookup)
        for j, block in enumerate(self.kv.block_ids(s)[: cached // bs]):
            assert self.written[block] == tuple(prompt[: (j + 1) * bs]), "a hit handed out another prefix's K/V"
        s.num_computed = cached
        self.hit_blocks += cached // bs
        self.live.append(s)

    def step(self) -> None:
        s = self.rng.choice(self.live)
        pending = len(s.token_ids) - s.num_computed
        if pending:
            self.compute(s, self.rng.randint(1, pending))  # a prompt chunk
        elif len(s.token_ids) < s.capacity:
            s.token_ids.append(self.rng.randrange(50))  # a generated token, computed next step
            self.compute(s, 1)

    def free(self) -> None:
        s = self.live.pop(self.rng.randrange(len(self.live)))
        self.kv.free(s)

    def random_operation(self) -> None:
        r = self.rng.random()
        if r < 0.25 or not self.live:
            self.allocate()
        elif r < 0.8:
            self.step()
        elif r < 0.999:
            self.free()
        else:
            self.kv.reset_prefix_cache()


def test_property_random_operations_keep_every_invariant():
    rng = random.Random(1234)
    world = World(KVCacheManager(num_blocks=48, block_size=4), rng)
    world.prefixes = [[rng.randrange(50) for _ in range(rng.randint(4, 40))] for _ in range(6)]
    for op in range(100_000):
        world.random_operation()
        if op % 10 == 0 or not world.live:
            world.kv.check()
        if not world.live:
            assert world.kv.num_free == world.kv.num_blocks  # nothing in flight: all free or evictable
    assert world.hit_blocks > 10_000  # the run did share blocks (else it proved little)
    for s in list(world.live):
        world.kv.free(s)
    world.kv.check()
    assert world.kv.num_free == world.kv.num_blocks
