"""The GGUF tensor directory read by stepping over the metadata: the same tensors, types, shapes and bytes
as gguf's GGUFReader, and a clear error for what is not a readable GGUF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tgi_llm.weights import default_gguf_path
from tgi_llm.weights.gguf_header import read_directory


def assert_same_as_gguf_reader(path: Path) -> None:
    from gguf import GGUFReader

    ours, theirs = read_directory(path), GGUFReader(path)
    assert ours.architecture == theirs.fields["general.architecture"].contents()
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert a.type_name == b.tensor_type.name, a.name
        assert a.shape == tuple(int(d) for d in b.shape), a.name
        assert a.data.dtype == np.uint8
        assert np.array_equal(a.data, np.ascontiguousarray(b.data).view(np.uint8).reshape(-1)), a.name


def write_gguf(path: Path, alignment: int | None) -> Path:
    """Metadata of every kind the header must step over (arrays of strings, numbers and bools, 64-bit
    values, nested arrays), then float and quantized tensors, with a custom alignment or the default."""
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
    from gguf.quants import quantize

    writer = GGUFWriter(path, "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_array("test.strings", ["a", "", "ünïcode", "x" * 300])
    writer.add_array("test.ints", [1, -2, 3])
    writer.add_array("test.floats", [0.5, 1.5])
    writer.add_array("test.bools", [True, False, True])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_key_value("test.u64", 2**40, GGUFValueType.UINT64)
    writer.add_key_value("test.f64", 0.25, GGUFValueType.FLOAT64)
    writer.add_bool("test.flag", True)
    writer.add_string("test.text", "after the arrays")
    rng = np.random.default_rng(0)
    writer.add_tensor("norm.weight", rng.standard_normal(64).astype(np.float32))
    writer.add_tensor("half.weight", rng.standard_normal((3, 64)).astype(np.float16))
    for kind in (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_1):
        data = rng.standard_normal((8, 64)).astype(np.float32)
        writer.add_tensor(f"{kind.name}.weight", quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_default_model_reads_as_gguf_reads_it():
    assert_same_as_gguf_reader(default_gguf_path())


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_metadata_kind_is_stepped_over(tmp_path, alignment):
    path = write_gguf(tmp_path / "m.gguf", alignment)
    assert_same_as_gguf_reader(path)
    directory = read_directory(path)
    assert [t.type_name for t in directory.tensors] == ["F32", "F16", "Q8_0", "Q4_1"]


def test_what_is_not_a_readable_gguf_is_one_clear_error(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_bytes(b"hello, this is not a model at all")
    with pytest.raises(ValueError, match="notes.gguf is not a GGUF file"):
        read_directory(text)
    good = write_gguf(tmp_path / "m.gguf", None).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good[:200])
    with pytest.raises(ValueError, match="cut.gguf: truncated GGUF header"):
        read_directory(cut)
    short = tmp_path / "short.gguf"
    short.write_bytes(good[:-100])
    with pytest.raises(ValueError, match="lies past the end of the file"):
        read_directory(short)
    old = tmp_path / "old.gguf"
    old.write_bytes(good[:4] + (1).to_bytes(4, "little") + good[8:])
    with pytest.raises(ValueError, match="GGUF version 1"):
        read_directory(old)
