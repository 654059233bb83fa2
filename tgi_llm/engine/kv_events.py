"""KV-cache events: which full blocks the prefix cache holds, as vLLM announces them to prefix-aware routers.

A router that picks a replica per request by its cached prefixes (llm-d's precise prefix-cache scorer, NVIDIA
Dynamo's KV router) rebuilds each replica's cache from these events alone: `BlockStored` when full blocks
become reusable (their chained hashes, the parent of the first, their token ids, the block size),
`BlockRemoved` when they are evicted, `AllBlocksCleared` when everything is gone (a restart). The manager
(kv_cache_manager.py) records them in a `KVEventLog` on the engine thread; the engine hands each step's
events to a publisher (kv_event_publisher.py: ZMQ PUB, vLLM's msgpack format) in order.

Hashes go out as vLLM's integer form: the last 8 bytes of our 16-byte BLAKE2b key, big-endian (vLLM does the
same with its SHA-256 keys). This module imports neither ZMQ nor torch: the launcher validates endpoints with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from tgi_llm.engine.block_hash import BlockHash


def external_hash(key: BlockHash) -> int:
    """A block key as events carry it (vLLM's `ExternalBlockHash` in its integer form)."""
    return int.from_bytes(key[-8:], "big")


@dataclass
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None = None
    medium: str | None = None


@dataclass
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None = None


@dataclass
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass
class KVEventLog:
    """Events since the last `drain`, in the order the cache changed. Consecutive removals share one event."""

    block_size: int
    #: Where the blocks live, as vLLM names it ("GPU", "CPU"): routers may weigh tiers differently.
    medium: str | None = None
    pending: list[KVEvent] = field(default_factory=list)

    def stored(self, keys: Sequence[BlockHash], parent: BlockHash | None, token_ids: list[int],
               lora_name: str | None) -> None:
        self.pending.append(BlockStored([external_hash(k) for k in keys],
                                        None if parent is None else external_hash(parent), token_ids,
                                        self.block_size, lora_name, self.medium))

    def removed(self, key: BlockHash) -> None:
        last = self.pending[-1] if self.pending else None
        if isinstance(last, BlockRemoved):
            last.block_hashes.append(external_hash(key))
        else:
            self.pending.append(BlockRemoved([external_hash(key)], self.medium))

    def cleared(self) -> None:
        self.pending.append(AllBlocksCleared())

    def drain(self) -> list[KVEvent]:
        out, self.pending = self.pending, []
        return out


_ENDPOINT = re.compile(r"^(tcp://(\*|\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}|ipc://.+|inproc://.+)$")


def check_endpoint(name: str, value: str | None) -> None:
    """ZMQ endpoints as vLLM's `--kv-events-config` takes them: `tcp://*:5557` binds, `tcp://host:5557`
    connects (to a router's bound SUB socket), `ipc://path` binds."""
    if not value:
        return
    if not _ENDPOINT.match(value) or (value.startswith("tcp://") and not 0 < int(value.rsplit(":", 1)[1]) < 65536):
        raise ValueError(f"`{name}` must be a ZMQ endpoint: tcp://*:PORT to bind, tcp://HOST:PORT to connect, "
                         f"or ipc://PATH. Given: {value!r}")


def check_kv_event_endpoints(endpoint: str | None, replay_endpoint: str | None) -> None:
    """--kv-events-endpoint and --kv-events-replay-endpoint, as the launcher and EngineOptions check them."""
    check_endpoint("kv_events_endpoint", endpoint)
    check_endpoint("kv_events_replay_endpoint", replay_endpoint)
    if replay_endpoint and not endpoint:
        raise ValueError("`kv_events_replay_endpoint` needs `kv_events_endpoint`")


def binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard address or a local transport binds; a named host is a peer to connect to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
