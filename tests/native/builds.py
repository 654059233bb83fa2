"""Other builds of the kernels library, for tests: other flags, or a copy of the sources with one edit."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

from tgi_llm.native.build import BASE_FLAGS, SOURCE_ROOT, build_library
from tgi_llm.native.loader import load


def patched_sources(tmp_path: Path, source: str, right: str, wrong: str) -> Path:
    """A copy of tgi_llm/csrc where `right` in `source` (a path under it) reads `wrong`."""
    root = tmp_path / "csrc"
    shutil.copytree(SOURCE_ROOT, root)
    path = root / source
    text = path.read_text(encoding="utf-8")
    assert right in text, f"{right!r} is not in {source}"
    path.write_text(text.replace(right, wrong), encoding="utf-8")
    return root


def build_variant(name: str, root: Path = SOURCE_ROOT, flags: tuple[str, ...] = BASE_FLAGS) -> ctypes.CDLL:
    """The kernels library built from `root` with `flags`, loaded and checked like the shipped one."""
    return load(build_library(name, root=root, flags=flags))


def with_march(march: str) -> tuple[str, ...]:
    """BASE_FLAGS for another target than this CPU."""
    return tuple(march if f == "-march=native" else f for f in BASE_FLAGS)
