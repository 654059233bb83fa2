"""KV-cache events from the manager: a subscriber that sees only the events knows exactly which blocks are
cached, with their tokens, through evictions and resets (the property test's random world, with events on)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from tests.engine.test_kv_cache_manager import World, compute_all, seq
from tgi_llm.engine.block_hash import hash_blocks
from tgi_llm.engine.kv_cache_manager import KVCacheManager
from tgi_llm.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventLog,
    binds,
    check_endpoint,
    external_hash,
)


@dataclass
class Subscriber:
    """What a router rebuilds: block hash -> (parent hash, token ids)."""

    blocks: dict[int, tuple[int | None, tuple[int, ...]]] = field(default_factory=dict)
    stored: int = 0
    removed: int = 0

    def apply(self, events: list) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                bs = event.block_size
                parent = event.parent_block_hash
                for i, h in enumerate(event.block_hashes):
                    assert h not in self.blocks, "a block stored twice without a removal between"
                    self.blocks[h] = (parent, tuple(event.token_ids[i * bs : (i + 1) * bs]))
                    parent = h
                self.stored += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    del self.blocks[h]  # KeyError: removal of a block never announced
                self.removed += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.blocks.clear()


def manager_with_events(num_blocks: int, block_size: int) -> KVCacheManager:
    kv = KVCacheManager(num_blocks, block_size)
    kv.events = KVEventLog(block_size, "CPU")
    return kv


def test_stored_blocks_carry_chained_hashes_parent_and_tokens():
    kv = manager_with_events(8, 2)
    a = seq([1, 2, 3, 4, 5], lora_name="sql")
    kv.allocate(a, 6)
    compute_all(kv, a)
    [event] = kv.events.drain()
    keys = hash_blocks([1, 2, 3, 4], 2, 2)
    assert event == BlockStored([external_hash(k) for k in keys], None, [1, 2, 3, 4], 2, "sql", "CPU")
    a.token_ids.append(6)  # a generated token fills the third block: its parent is the second
    compute_all(kv, a)
    [event] = kv.events.drain()
    assert event.parent_block_hash == external_hash(keys[1]) and event.token_ids == [5, 6]


def test_eviction_is_announced_and_consecutive_removals_share_one_event():
    kv = manager_with_events(2, 2)
    a = seq([1, 2, 3, 4])
    kv.allocate(a, 4)
    compute_all(kv, a)
    kv.free(a)
    stored = kv.events.drain()
    b = seq([7, 7, 7, 7])
    kv.allocate(b, 4)  # takes both cached-free blocks
    [removed] = kv.events.drain()
    assert isinstance(removed, BlockRemoved) and removed.medium == "CPU"
    assert sorted(removed.block_hashes) == sorted(stored[0].block_hashes)


def test_a_duplicate_block_is_not_announced_and_splits_the_run():
    kv = manager_with_events(16, 2)
    a, b = seq([1, 2, 3, 4, 5, 6, 8]), seq([1, 2, 3, 4, 5, 6, 8])
    kv.allocate(a, 7)
    kv.allocate(b, 7)  # both prefill the same prompt at once: nothing cached yet
    a.num_computed = 2
    kv.cache_computed(a)  # a registers block 0 first
    compute_all(kv, b)  # b: block 0 is a duplicate, blocks 1-2 are new
    events = kv.events.drain()
    assert [len(e.block_hashes) for e in events] == [1, 2]
    assert events[1].parent_block_hash == events[0].block_hashes[0]


def test_property_the_events_alone_rebuild_the_cached_blocks():
    rng = random.Random(99)
    world = World(manager_with_events(40, 4), rng)
    world.prefixes = [[rng.randrange(50) for _ in range(rng.randint(4, 40))] for _ in range(6)]
    sub = Subscriber()
    for op in range(30_000):
        world.random_operation()
        sub.apply(world.kv.events.drain())
        if op % 10 == 0:
            registered = world.kv._block_of  # noqa: SLF001 (the truth the events must match)
            assert set(sub.blocks) == {external_hash(k) for k in registered}
            for key, block in registered.items():
                assert sub.blocks[external_hash(key)][1] == world.written[block][-4:]
    assert sub.removed > 1000 and sub.stored > sub.removed  # evictions happened, many times


def test_no_events_are_recorded_without_a_log():
    kv = KVCacheManager(4, 2)
    a = seq([1, 2, 3])
    kv.allocate(a, 3)
    compute_all(kv, a)
    assert kv.events is None


@pytest.mark.parametrize("endpoint", ["tcp://*:5557", "tcp://127.0.0.1:5557", "tcp://epp.svc.local:1",
                                      "tcp://[::1]:5557", "ipc:///tmp/kv.sock"])
def test_endpoints_vllm_accepts(endpoint):
    check_endpoint("kv_events_endpoint", endpoint)


@pytest.mark.parametrize("endpoint", ["5557", "tcp://*", "tcp://host:0", "tcp://host:70000", "http://x:1",
                                      "tcp://a b:1"])
def test_bad_endpoints_are_refused_naming_the_flag(endpoint):
    with pytest.raises(ValueError, match="`kv_events_endpoint` must be a ZMQ endpoint"):
        check_endpoint("kv_events_endpoint", endpoint)


def test_wildcards_and_local_transports_bind_named_hosts_connect():
    assert binds("tcp://*:1") and binds("tcp://[::]:1") and binds("ipc:///x")
    assert not binds("tcp://127.0.0.1:1") and not binds("tcp://epp:1")
