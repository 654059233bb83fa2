"""Fixed-size KV-cache blocks handed out from a free list.

Blocks carry reference counts so that a prefix cache can later share one block among several
requests; today every allocation owns its blocks alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass
class BlockAllocation:
    """The blocks one request holds, in order: token i lives in blocks[i // block_size]."""

    blocks: list[int]
    block_size: int

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.block_size

    def slot(self, position: int) -> int:
        return self.blocks[position // self.block_size] * self.block_size + position % self.block_size

    def slots(self, start: int, end: int) -> list[int]:
        bs = self.block_size
        return [self.blocks[p // bs] * bs + p % bs for p in range(start, end)]


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._refcount = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, num_tokens: int) -> BlockAllocation | None:
        """Blocks for `num_tokens` tokens, or None (nothing taken) when too few are free."""
        needed = self.blocks_for(max(num_tokens, 1))
        if needed > len(self._free):
            return None
        blocks = [self._free.popleft() for _ in range(needed)]
        for b in blocks:
            self._refcount[b] = 1
        return BlockAllocation(blocks=blocks, block_size=self.block_size)

    def free(self, allocation: BlockAllocation) -> None:
        for b in allocation.blocks:
            if self._refcount[b] <= 0:
                raise RuntimeError(f"KV block {b} freed twice")
            self._refcount[b] -= 1
            if self._refcount[b] == 0:
                self._free.append(b)
        allocation.blocks = []
