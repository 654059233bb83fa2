"""A GGUF file's tensor directory, read without turning its metadata into Python objects.

gguf's GGUFReader makes a numpy view of every part of every metadata value: SmolLM2's 49k-token
vocabulary and 48k merges took 4.3 s of each server start (2-vCPU Xeon) to reach the 272 tensors' names,
types and offsets, which is all serving reads from the file (the converted directory holds the config and
the tokenizer). Here metadata values are stepped over as bytes, since every string and array says its own
length, and only `general.architecture` and `general.alignment` are kept.

The format (little-endian, versions 2 and 3): magic "GGUF", version u32, tensor count u64, metadata count
u64; each metadata entry a key (u64 length + UTF-8) and a typed value; each tensor a name, a dimension
count u32, the dimensions u64 (innermost first), a type u32 and an offset u64 into the data, which starts
at the next multiple of the alignment after the directory.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
#: Metadata value types of fixed size: their byte counts.
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type_name: str  # the GGML type: "Q4_1", "Q8_0", "F32", ...
    shape: tuple[int, ...]  # as the file lists it: innermost dimension first
    data: np.ndarray  # its bytes, uint8, a view of the file's memory map


@dataclass(frozen=True)
class GGUFDirectory:
    architecture: str | None
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        self.pos += n
        if self.pos > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF header")
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.take("<Q")  # not `self.pos += self.take(...)`: that adds to the position before the take
        self.pos += n

    def skip_value(self, kind: int) -> None:
        if kind in _FIXED:
            self.pos += _FIXED[kind]
        elif kind == _STRING:
            self.skip_string()
        elif kind == _ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item in _FIXED:
                self.pos += _FIXED[item] * count
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ValueError(f"{self.path}: unknown GGUF metadata type {kind} at byte {self.pos}")


def read_directory(path: str | Path) -> GGUFDirectory:
    """The tensors of the GGUF at `path`, their bytes left in the file's memory map."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # constants only: no reader

    path = Path(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    cursor = _Cursor(memoryview(data), path)
    try:
        if bytes(data[:4]) != MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        cursor.pos = 4
        version = cursor.take("<I")
        if version not in VERSIONS:
            raise ValueError(f"{path}: GGUF version {version} (little-endian {VERSIONS} are read)")
        n_tensors, n_meta = cursor.take("<Q"), cursor.take("<Q")
        architecture, alignment = None, DEFAULT_ALIGNMENT
        for _ in range(n_meta):
            key, kind = cursor.string(), cursor.take("<I")
            if key == "general.architecture" and kind == _STRING:
                architecture = cursor.string()
            elif key == "general.alignment" and kind == _UINT32:
                alignment = cursor.take("<I")
            else:
                cursor.skip_value(kind)
        entries = []
        for _ in range(n_tensors):
            name = cursor.string()
            shape = tuple(cursor.take("<Q") for _ in range(cursor.take("<I")))
            entries.append((name, shape, cursor.take("<I"), cursor.take("<Q")))
    except struct.error:
        raise ValueError(f"{path}: truncated GGUF header") from None
    start = -(-cursor.pos // alignment) * alignment
    tensors = []
    for name, shape, type_id, offset in entries:
        kind = GGMLQuantizationType(type_id)
        block, size = GGML_QUANT_SIZES[kind]
        nbytes = math.prod(shape) // block * size
        if start + offset + nbytes > len(data):
            raise ValueError(f"{path}: tensor {name} lies past the end of the file")
        tensors.append(GGUFTensor(name, kind.name, shape, data[start + offset:start + offset + nbytes]))
    return GGUFDirectory(architecture, tensors)
