"""Where the server's memory goes: weights, KV cache, everything else (logged at start-up, a Prometheus gauge).

weights: every tensor the model holds (float parameters, oneDNN-packed copies, quantized codes and
scales), counted once. kv_cache: the pool's bytes; the pool is reserved, not touched (see kv_cache.py),
so `kv_cache_resident` says how much of it the OS has backed so far (mincore). other: the process's
resident memory minus the resident weights and KV pages (Python, torch, kernels, activations).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from tgi_llm.kv_cache import cache_memory

logger = logging.getLogger(__name__)
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class MemoryAccount:
    weights: int
    kv_cache: int
    kv_cache_resident: int
    rss: int
    #: The LoRA slots (--max-loras adapters of --max-lora-rank, allocated at start-up).
    lora_adapters: int = 0

    @property
    def other(self) -> int:
        return max(0, self.rss - self.weights - self.kv_cache_resident - self.lora_adapters)

    def to_dict(self) -> dict[str, int]:
        return asdict(self) | {"other": self.other}

    def describe(self) -> str:
        mb = 1e-6
        return (f"weights {self.weights * mb:.1f} MB, KV cache {self.kv_cache * mb:.1f} MB "
                f"({self.kv_cache_resident * mb:.1f} MB touched), "
                + (f"LoRA adapters {self.lora_adapters * mb:.1f} MB, " if self.lora_adapters else "")
                + f"other {self.other * mb:.1f} MB "
                f"(process RSS {self.rss * mb:.1f} MB)")


def _tensor_bytes(t: torch.Tensor) -> int:
    if t.is_mkldnn:  # oneDNN-packed weights have no storage to ask
        return t.numel() * t.element_size()
    return t.untyped_storage().nbytes()


def weight_bytes(model: nn.Module) -> int:
    """Each storage once (tied embedding/LM head share one), plus quantized weights (plain attributes)."""
    seen: dict[int, int] = {}
    tensors = [*model.parameters(), *model.buffers()]
    for m in model.modules():
        for value in vars(m).values():
            if isinstance(value, torch.Tensor):
                tensors.append(value)
            elif hasattr(value, "tensors") and hasattr(value, "nbytes"):  # a QuantizedWeight
                tensors.extend(value.tensors())
    for t in tensors:
        key = id(t) if t.is_mkldnn else t.untyped_storage().data_ptr()
        seen[key] = _tensor_bytes(t)
    return sum(seen.values())


def resident_bytes(t: torch.Tensor) -> int:
    """How much of a CPU tensor's memory the OS has backed with pages (mincore); its size elsewhere."""
    size = t.numel() * t.element_size()
    if t.device.type != "cpu" or size == 0:
        return size
    start = t.data_ptr() // _PAGE * _PAGE
    pages = (t.data_ptr() + size - start + _PAGE - 1) // _PAGE
    vec = (ctypes.c_ubyte * pages)()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * _PAGE), vec) != 0:
            return size
    except (OSError, AttributeError):
        return size
    return min(size, sum(b & 1 for b in bytes(vec)) * _PAGE)


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def available_bytes() -> int | None:
    """The kernel's estimate of memory that can be had without swapping (MemAvailable; None off Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def account(model: nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> MemoryAccount:
    kv = [cache_memory(t) for pair in kv_caches for t in pair]
    rss = rss_bytes()
    lora = getattr(model, "lora", None)
    return MemoryAccount(weight_bytes(model), sum(t.numel() * t.element_size() for t in kv),
                         sum(resident_bytes(t) for t in kv), rss, lora.nbytes if lora is not None else 0)


def libc_trim() -> Callable[[], int] | None:
    """glibc's malloc_trim(0): hands the free memory of the heaps back to the OS (None without glibc)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)
