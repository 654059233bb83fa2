"""The structs and enums shared with C are checked when the library loads: drift fails loudly."""

from __future__ import annotations

import ctypes

import pytest

from tgi_llm.native import abi, library

pytestmark = pytest.mark.usefixtures("c_kernels")


def test_the_library_reports_every_struct_and_enum_the_python_side_mirrors():
    found = abi.library_abi(library())
    assert found == abi.expected_abi()
    assert {"sizeof(qweight_t)", "sizeof(layer_t)", "sizeof(prompts_t)", "QW_BF16_PANEL"} <= found.keys()


def test_every_declared_signature_is_bound():
    lib = library()
    for name, (argtypes, restype) in abi.SIGNATURES.items():
        if name in abi.OPTIONAL and not lib.has_bf16_prefill():
            continue
        assert getattr(lib, name).argtypes == argtypes and getattr(lib, name).restype == restype, name


def test_a_struct_that_drifted_fails_loudly(monkeypatch):
    class OldDesc(ctypes.Structure):  # qweight_t before its last field
        _fields_ = abi.WeightDesc._fields_[:-1]

    monkeypatch.setattr(abi, "C_NAMES", {**{k: v for k, v in abi.C_NAMES.items() if k is not abi.WeightDesc},
                                         OldDesc: "qweight_t"})
    wrong = r"qweight_t.bf16_min_rows: C 64, Python missing; sizeof\(qweight_t\): C 72, Python 64"
    with pytest.raises(abi.AbiMismatch, match=wrong):
        abi.check_abi(library())


def test_an_enum_that_drifted_fails_loudly(monkeypatch):
    monkeypatch.setattr(abi, "WeightKind", abi.IntEnum("WeightKind", {"QW_Q4_GGUF": 0, "QW_Q4_X8": 2}))
    with pytest.raises(abi.AbiMismatch, match="QW_Q4_X8: C 1, Python 2"):
        abi.check_abi(library())
