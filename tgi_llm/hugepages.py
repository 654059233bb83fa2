"""Model weights in transparent huge pages.

A decode step streams every weight byte once, so its speed is the memory read rate. From 4 KiB pages that
is a TLB miss every 4 KiB (138k per token for SmolLM2 in float32), and in a VM each miss walks both the
guest's and the host's page tables. Measured on a 2-vCPU Zen 4 VM (docs/CPU_KERNELS.md, "Huge pages and memory"): two
threads summing 540 MB of float32 read 32.5-48 GB/s from 4 KiB pages and 35-62 GB/s from 2 MiB ones.
llama.cpp gets the same from its file mapping (the page cache holds its GGUF in huge folios).

Weights are copied once, at load, into private anonymous mappings advised MADV_HUGEPAGE: Linux's usual
THP mode ("madvise") backs only advised memory, and "never" leaves them in ordinary pages, still correct.
Tensors share 2 MiB-aligned chunks, so rounding to huge pages costs at most one partly used huge page
per chunk; each tensor keeps its mapping alive (torch.frombuffer holds the buffer), so a model's weights
are unmapped with the model. `zeros` maps large pools (the KV cache) the same way, untouched until used.
TGI_LLM_HUGE_PAGES=0 leaves weights where torch put them and pools in ordinary pages.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import mmap
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from tgi_llm.settings import settings

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
#: Tensors smaller than this stay where they are: they are read from cache, and a chunk per model of them
#: would be rounding waste.
MIN_BYTES = 64 << 10
#: Tensors up to half a chunk share chunks; larger ones get their own mapping.
CHUNK_BYTES = 128 << 20
#: Each tensor starts on a cache line (the kernels' vector loads need no more).
ALIGN = 64


def _address(buf: mmap.mmap) -> int:
    view = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # releases the export, or the mapping could never be closed


@dataclass
class _Mapping:
    buf: mmap.mmap
    start: int  # offset of the first 2 MiB-aligned byte
    length: int
    used: int = 0


def _map(nbytes: int, advise: bool = True) -> _Mapping:
    """Anonymous private memory (advised for huge pages), `nbytes` usable from a 2 MiB boundary. Private,
    not shared: shared anonymous memory is shmem, which THP backs only under `shmem_enabled` ("never" by
    default), whatever the advice."""
    length = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    buf = mmap.mmap(-1, length + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if advise:
        buf.madvise(mmap.MADV_HUGEPAGE)  # only addresses matter here: no page is touched until written
    return _Mapping(buf, (-_address(buf)) % HUGE_PAGE, length)


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros in a mapping of its own, untouched: Linux backs it with pages (huge ones where it
    can, unless TGI_LLM_HUGE_PAGES=0) as they are first written, so a large pool costs resident memory only
    as it is used. The tensor keeps the mapping alive."""
    nbytes = math.prod(shape) * dtype.itemsize
    own = _map(nbytes, advise=enabled())
    return torch.frombuffer(own.buf, dtype=torch.uint8, count=nbytes, offset=own.start).view(dtype).view(shape)


@dataclass
class HugePageArena:
    """Places tensors in huge-page chunks for as long as one model loads (`weights_in_huge_pages`)."""

    placed_bytes: int = 0
    _chunk: _Mapping | None = field(default=None, repr=False)

    def place(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of CPU tensor `t` in huge pages; `t` itself when it is small, not on the CPU, or when the
        system cannot map memory that way."""
        nbytes = t.numel() * t.element_size()
        if t.device.type != "cpu" or nbytes < MIN_BYTES or t.is_mkldnn:
            return t
        try:
            buf, offset = self._reserve(nbytes)
        except (OSError, ValueError) as exc:  # no MADV_HUGEPAGE here (an old kernel), mmap refused
            logger.debug("huge pages unavailable (%s): weights stay in ordinary pages", exc)
            return t
        out = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset).view(t.dtype).view(t.shape)
        out.copy_(t)
        self.placed_bytes += nbytes
        return out

    def _reserve(self, nbytes: int) -> tuple[mmap.mmap, int]:
        """Where `nbytes` go: a mapping and the offset in it."""
        if nbytes > CHUNK_BYTES // 2:
            own = _map(nbytes)
            return own.buf, own.start
        if self._chunk is None or self._chunk.used + nbytes > self._chunk.length:
            self._chunk = _map(CHUNK_BYTES)
        chunk = self._chunk
        offset = chunk.start + chunk.used
        chunk.used += -(-nbytes // ALIGN) * ALIGN
        return chunk.buf, offset


_ARENA: ContextVar[HugePageArena | None] = ContextVar("tgi_llm_huge_page_arena", default=None)


def enabled() -> bool:
    return settings().huge_pages and hasattr(mmap, "MADV_HUGEPAGE")


@contextlib.contextmanager
def weights_in_huge_pages() -> Iterator[HugePageArena | None]:
    """While loading a model: `in_huge_pages` copies weights into huge pages (a no-op when disabled)."""
    arena = HugePageArena() if enabled() else None
    token = _ARENA.set(arena)
    try:
        yield arena
    finally:
        _ARENA.reset(token)


def in_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """`t` copied into huge pages while a model loads under `weights_in_huge_pages`; else `t` itself."""
    arena = _ARENA.get()
    return t if arena is None else arena.place(t)


def huge_page_bytes() -> int:
    """This process's anonymous memory in huge pages (AnonHugePages), 0 where unknown."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
