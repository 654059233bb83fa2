"""Identity of a full KV block for the prefix cache: a hash chained over every token before it.

A block's K/V depend on all the tokens up to its end, so its key is hash(parent key, its own tokens,
extra key). The extra key (for the first block, hence for the whole chain) keeps apart requests whose
K/V differ for the same tokens: a LoRA adapter, a cache salt. BLAKE2b, not Python's `hash`: a prompt
crafted to collide with another user's prefix would otherwise read that user's K/V.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = bytes


def hash_block(parent: BlockHash | None, tokens: Sequence[int], extra_key: bytes = b"") -> BlockHash:
    h = hashlib.blake2b(array("q", tokens).tobytes(), digest_size=16)
    if parent is not None:
        h.update(parent)
    else:
        h.update(b"\0root" + extra_key)
    return h.digest()


def hash_blocks(tokens: Sequence[int], block_size: int, num_blocks: int, parent: BlockHash | None = None,
                extra_key: bytes = b"") -> list[BlockHash]:
    """Keys of the first `num_blocks` full blocks of `tokens`, continuing the chain from `parent`."""
    out: list[BlockHash] = []
    for i in range(num_blocks):
        parent = hash_block(parent, tokens[i * block_size : (i + 1) * block_size], extra_key)
        out.append(parent)
    return out
