import pytest

from tgi_llm.engine.block_allocator import BlockAllocator


def test_allocates_enough_blocks_for_tokens():
    alloc = BlockAllocator(num_blocks=10, block_size=4)
    a = alloc.allocate(9)
    assert a is not None and len(a.blocks) == 3 and a.capacity == 12
    assert alloc.num_free == 7


def test_slots_follow_block_table():
    alloc = BlockAllocator(num_blocks=8, block_size=4)
    alloc.allocate(4)  # take block 0 so the next allocation is not the identity
    a = alloc.allocate(6)
    assert a.blocks == [1, 2]
    assert a.slots(0, 6) == [4, 5, 6, 7, 8, 9]
    assert a.slot(5) == 9


def test_refuses_without_taking_anything_when_short():
    alloc = BlockAllocator(num_blocks=3, block_size=4)
    assert alloc.allocate(13) is None
    assert alloc.num_free == 3


def test_free_returns_blocks_and_rejects_double_free():
    alloc = BlockAllocator(num_blocks=4, block_size=2)
    a = alloc.allocate(8)
    held = list(a.blocks)
    alloc.free(a)
    assert alloc.num_free == 4
    a.blocks = held
    with pytest.raises(RuntimeError, match="freed twice"):
        alloc.free(a)
