from __future__ import annotations

import os
from pathlib import Path

import pytest

from tgi_llm.parallel.mpi_shm import PREFIX, mapped_segments, unlink_mapped_segments

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")


def test_only_mapped_mpich_segments_are_unlinked(tmp_path):
    ours = Path(f"{PREFIX}test_{os.getpid()}_0")
    other = Path(f"/dev/shm/not_mpich_{os.getpid()}")
    ours.write_bytes(b"x")
    other.write_bytes(b"x")
    try:
        maps = tmp_path / "maps"
        maps.write_text(
            f"7f00-7f01 rw-s 00000000 00:1a 12 {ours}\n"
            f"7f01-7f02 rw-s 00000000 00:1a 13 {other}\n"
            f"7f02-7f03 rw-s 00000000 00:1a 14 {PREFIX}gone_0 (deleted)\n"
            "7f03-7f04 r-xp 00000000 08:01 15 /usr/lib/libc.so.6\n")
        assert mapped_segments(maps) == [str(ours)]
        assert unlink_mapped_segments(maps) == [str(ours)]
        assert not ours.exists() and other.exists()
        assert unlink_mapped_segments(maps) == []  # already gone: nothing to do, no error
    finally:
        ours.unlink(missing_ok=True)
        other.unlink(missing_ok=True)


def test_unreadable_maps_mean_nothing_to_remove(tmp_path):
    assert unlink_mapped_segments(tmp_path / "missing") == []
