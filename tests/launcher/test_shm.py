"""The Python backend's shared memory that a dead stub leaves behind is found and removed."""

from __future__ import annotations

import subprocess
import sys
import time

from tgi_llm.launcher.shm import REGION_PREFIX, remove_regions, stub_regions


def test_the_region_is_read_from_the_stubs_command_line(tmp_path):
    region = REGION_PREFIX + "1234-abcd"
    model = tmp_path / "model.py"
    model.write_text("import time; time.sleep(30)")
    # a stand-in stub with the stub's argument layout: `<binary> <model.py> <region> <size> ...`
    child = subprocess.Popen([sys.executable, str(model), region, "1048576"])
    try:
        for _ in range(100):  # hang guard while it starts
            if stub_regions([child.pid]):
                break
            time.sleep(0.05)
        assert stub_regions([child.pid]) == [region]
    finally:
        child.kill()
        child.wait()
    assert stub_regions([child.pid]) == []  # gone: nothing to read


def test_only_the_named_regions_are_removed(tmp_path):
    ours, other = REGION_PREFIX + "a", REGION_PREFIX + "b"
    for name in (ours, other):
        (tmp_path / name).write_bytes(b"\0")
    assert remove_regions([ours, REGION_PREFIX + "gone"], tmp_path) == [ours]
    assert sorted(p.name for p in tmp_path.iterdir()) == [other]
