"""The engine's LoRA adapters: which names requests may ask for, which of the model's `max_loras` slots each
resident adapter holds, and who uses them. Torch-free: reading an adapter is the `check` it is given.

An adapter's life: `register` (start-up, or POST /v1/load_lora_adapter) reads and checks it, then requests
`lookup` it by name at validation and `hold` it until they end. A request `admit`ted to the batch pins its
adapter's slot: a resident adapter's slot is shared; otherwise the least recently used slot that no running
request pins is given to it, and the load is queued for the runner (`take_loads`: it reads the adapter from
disk into the slot before the next forward). So more adapters may be registered than fit, and a request
waits in the queue only while every slot is pinned by others. `unregister` stops new requests at once; the
adapter leaves its slot when the last request using it ends.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tgi_llm.errors import ValidationError


@dataclass(eq=False)
class Adapter:
    name: str
    path: str
    #: Unique over the server's life: the prefix-cache key of its requests (a reload under the same name is
    #: another adapter, whose K/V must not mix with the old one's).
    uid: int
    #: Requests submitted with it that have not ended.
    requests: int = 0
    retired: bool = False

    @property
    def cache_key(self) -> bytes:
        return f"lora:{self.uid}".encode()


@dataclass
class LoraLoad:
    """Read the adapter at `path` into `slot` before the next forward."""

    slot: int
    path: str


class LoraLoadError(RuntimeError):
    """An adapter could not be read into its slot (its files changed since it was registered)."""

    def __init__(self, slot: int, message: str) -> None:
        super().__init__(message)
        self.slot = slot


@dataclass
class _Slot:
    adapter: Adapter | None = None
    running: int = 0  # admitted requests using it
    last_used: float = 0.0


@dataclass
class LoraStats:
    max_loras: int
    running: list[str]  # adapters of running requests
    waiting: list[str]  # adapters of requests not yet running
    registered: list[str]
    requests_total: dict[str, int]  # per adapter name, since start


@dataclass
class LoraRegistry:
    max_loras: int
    max_rank: int
    #: check(path): raises ValueError naming what keeps the adapter at `path` off this model.
    check: Callable[[str], None]
    #: Whether /v1/load_lora_adapter and /v1/unload_lora_adapter may change the list at run time.
    runtime_loading: bool = False
    _names: dict[str, Adapter] = field(default_factory=dict)
    _slots: list[_Slot] = field(default_factory=list)
    _loads: list[LoraLoad] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _uids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _requests_total: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._slots = [_Slot() for _ in range(self.max_loras)]

    # ---- any thread ----
    def register(self, name: str, path: str) -> Adapter:
        """Read and check the adapter; ValueError (the adapter's fault) or KeyError (the name is taken)."""
        with self._lock:
            if name in self._names:
                raise KeyError(f"LoRA adapter {name!r} is already loaded")
        self.check(path)  # outside the lock: it reads files
        with self._lock:
            if name in self._names:
                raise KeyError(f"LoRA adapter {name!r} is already loaded")
            adapter = self._names[name] = Adapter(name, path, next(self._uids))
        return adapter

    def unregister(self, name: str) -> None:
        """KeyError when no such adapter is loaded. Requests using it run to their end."""
        with self._lock:
            adapter = self._names.pop(name, None)
            if adapter is None:
                raise KeyError(f"LoRA adapter {name!r} is not loaded")
            adapter.retired = True
            if adapter.requests == 0:
                self._evict(adapter)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._names)

    def lookup(self, name: str) -> Adapter:
        with self._lock:
            adapter = self._names.get(name)
            if adapter is None:
                loaded = ", ".join(self._names) or "none"
                raise ValidationError(f"LoRA adapter {name!r} is not loaded (loaded adapters: {loaded})")
            return adapter

    def hold(self, adapter: Adapter) -> None:
        with self._lock:
            adapter.requests += 1
            self._requests_total[adapter.name] += 1

    def drop(self, adapter: Adapter) -> None:
        with self._lock:
            adapter.requests -= 1
            if adapter.retired and adapter.requests == 0:
                self._evict(adapter)

    def stats(self, waiting: list[Adapter]) -> LoraStats:
        with self._lock:
            running = [s.adapter.name for s in self._slots if s.adapter is not None and s.running]
            return LoraStats(self.max_loras, running, sorted({a.name for a in waiting}), list(self._names),
                             dict(self._requests_total))

    # ---- engine thread ----
    def can_admit(self, adapter: Adapter) -> bool:
        with self._lock:
            return self._slot_of(adapter) is not None or self._free_slot() is not None

    def admit(self, adapter: Adapter) -> int:
        """The slot `adapter` runs in, pinned until `leave` (after `can_admit` said yes)."""
        with self._lock:
            index = self._slot_of(adapter)
            if index is None:
                index = self._free_slot()
                assert index is not None, "admit without a free slot"
                self._slots[index].adapter = adapter
                self._loads = [load for load in self._loads if load.slot != index]
                self._loads.append(LoraLoad(index, adapter.path))
            self._slots[index].running += 1
            return index

    def leave(self, index: int) -> None:
        with self._lock:
            slot = self._slots[index]
            slot.running -= 1
            slot.last_used = time.monotonic()

    def take_loads(self) -> list[LoraLoad]:
        with self._lock:
            loads, self._loads = self._loads, []
            return loads

    def forget(self, index: int) -> None:
        """The slot's load failed: it holds no adapter."""
        with self._lock:
            self._slots[index].adapter = None

    # ---- under the lock ----
    def _slot_of(self, adapter: Adapter) -> int | None:
        return next((i for i, s in enumerate(self._slots) if s.adapter is adapter), None)

    def _free_slot(self) -> int | None:
        """An empty slot, else the least recently used one no running request pins."""
        free = [(s.adapter is not None, s.last_used, i) for i, s in enumerate(self._slots) if s.running == 0]
        return min(free)[2] if free else None

    def _evict(self, adapter: Adapter) -> None:
        for slot in self._slots:
            if slot.adapter is adapter and slot.running == 0:
                slot.adapter = None
