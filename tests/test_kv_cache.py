"""The KV pool's memory: zeroed, private, on huge pages where the kernel offers them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.test_hugepages import anon_huge_kb, mapping_of, thp_mode
from tgi_llm.hugepages import HUGE_PAGE
from tgi_llm.kv_cache import allocate_kv_cache

#: 33.5 MB per K or V tensor: large enough for a mapping of its own.
CONFIG = SimpleNamespace(num_key_value_heads=2, head_dim=64, num_hidden_layers=2)


def private(t: torch.Tensor) -> bool:
    lo, _ = mapping_of(t)
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if int(fields[0].split("-")[0], 16) == lo:
                return fields[1].endswith("p")
    raise AssertionError("mapping not found")


def test_a_large_pool_is_zeroed_private_memory_on_huge_page_boundaries():
    k, v = allocate_kv_cache(CONFIG, num_blocks=4096, block_size=16)[0]
    assert k.data_ptr() % HUGE_PAGE == 0 and v.data_ptr() % HUGE_PAGE == 0
    # shared anonymous memory is shmem: THP leaves it in 4 KiB pages whatever the advice ("never" by default)
    assert private(k) and private(v)
    assert not k.any() and not v.any()


@pytest.mark.skipif(thp_mode() != "madvise", reason="needs THP in madvise mode (advice decides)")
def test_written_blocks_lie_in_huge_pages_unless_turned_off(use_settings):
    k, _ = allocate_kv_cache(CONFIG, num_blocks=4096, block_size=16)[0]
    k.view(-1)[: 2 * HUGE_PAGE // 4].fill_(1.0)
    assert anon_huge_kb(*mapping_of(k)) >= HUGE_PAGE // 1024  # (a fragmented machine may back some in 4 KiB)
    use_settings(huge_pages=False)
    plain, _ = allocate_kv_cache(CONFIG, num_blocks=4096, block_size=16)[0]
    plain.view(-1)[: 2 * HUGE_PAGE // 4].fill_(1.0)
    assert anon_huge_kb(*mapping_of(plain)) == 0
