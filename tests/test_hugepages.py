"""Weights copied into huge-page mappings at load: equal, aligned, released with their tensors."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from tgi_llm import hugepages
from tgi_llm.hugepages import HUGE_PAGE, MIN_BYTES, in_huge_pages, weights_in_huge_pages


def mapping_of(t: torch.Tensor) -> tuple[int, int]:
    """The /proc/self/maps range holding `t`'s first byte."""
    addr = t.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return lo, hi
    raise AssertionError(f"{addr:#x} is not mapped")


def anon_huge_kb(lo: int, hi: int) -> int:
    """AnonHugePages of the smaps entry covering [lo, hi)."""
    entry = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split()[0] and ":" not in line.split()[0]:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            entry = (start, end)
        elif line.startswith("AnonHugePages:") and entry and entry[0] <= lo and hi <= entry[1]:
            return int(line.split()[1])
    return 0


def test_placed_tensors_are_equal_aligned_copies():
    small = torch.randn(8)
    with weights_in_huge_pages() as arena:
        sources = [torch.randn(300, 577), torch.randn(64, 1000).half(), torch.randint(-128, 127, (5000, 40),
                                                                                      dtype=torch.int8)]
        placed = [in_huge_pages(t) for t in sources]
        transposed = torch.randn(640, 96).t()  # not contiguous: the copy is
        placed_t = in_huge_pages(transposed)
        assert in_huge_pages(small) is small  # below MIN_BYTES: left alone
    assert arena is not None
    for src, out in zip([*sources, transposed], [*placed, placed_t], strict=True):
        assert out.dtype == src.dtype and out.shape == src.shape and out.is_contiguous()
        assert torch.equal(out, src) and out.data_ptr() != src.data_ptr()
        assert out.data_ptr() % 64 == 0
    assert placed[0].data_ptr() % HUGE_PAGE == 0  # a fresh chunk starts on a huge page
    assert arena.placed_bytes == sum(t.numel() * t.element_size() for t in [*sources, transposed])
    # shared chunk: consecutive tensors sit next to each other, not a huge page apart each
    assert 0 < placed[1].data_ptr() - placed[0].data_ptr() < 300 * 577 * 4 + 64


def test_outside_a_load_or_when_disabled_tensors_stay_put(use_settings):
    t = torch.randn(256, 256)
    assert in_huge_pages(t) is t
    use_settings(huge_pages=False)
    with weights_in_huge_pages() as arena:
        assert arena is None and in_huge_pages(t) is t


def mapped(addr: int) -> bool:
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return True
    return False


def test_mappings_are_unmapped_with_their_last_tensor():
    big = torch.randn(hugepages.CHUNK_BYTES // 4 // 2 + 1024)  # over half a chunk: its own mapping
    with weights_in_huge_pages():
        placed = in_huge_pages(big)
        first, second = in_huge_pages(torch.randn(MIN_BYTES // 4)), in_huge_pages(torch.randn(MIN_BYTES // 4))
    own, chunk = placed.data_ptr(), first.data_ptr()
    assert second.data_ptr() - chunk == MIN_BYTES  # one chunk holds both
    del placed, first
    gc.collect()
    assert not mapped(own)
    assert mapped(chunk)  # `second` still lives in that chunk
    del second
    gc.collect()
    assert not mapped(chunk)


def thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "unavailable"
    return text[text.index("[") + 1:text.index("]")]


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off here")
def test_where_the_kernel_offers_huge_pages_the_weights_get_them():
    with weights_in_huge_pages():
        placed = in_huge_pages(torch.randn(4 * HUGE_PAGE // 4))  # 4 huge pages of float32
    lo, hi = mapping_of(placed)
    assert anon_huge_kb(lo, hi) >= HUGE_PAGE // 1024  # (a fragmented machine may back some in small pages)
