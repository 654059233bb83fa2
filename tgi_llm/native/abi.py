"""The Python side of tgi_llm/csrc/include/kernels.h: the structs and enums that cross the ctypes boundary and
the signature of every exported function, each declared once here and checked against what the library was
compiled with when it loads (`check_abi`, against `native_abi` of csrc/abi.c), so that drift fails loudly."""

from __future__ import annotations

import ctypes
from enum import IntEnum

from tgi_llm.kv_cache import Q8_GROUP

_p, _i32, _i64, _f32 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_float


class AbiMismatch(RuntimeError):
    """The library's structs or enums differ from their mirrors here."""


class WeightKind(IntEnum):
    """`qweight_kind_t`: a weight's layout and byte order."""

    QW_Q4_GGUF = 0
    QW_Q4_X8 = 1
    QW_Q8 = 2
    QW_Q4_PANEL = 3
    QW_F32 = 4
    QW_Q8_PANEL = 5
    QW_F32_PANEL = 6
    QW_BF16_PANEL = 7


class WeightDesc(ctypes.Structure):
    """`qweight_t`: where a weight's bytes are, for `quant_apply`. It holds raw pointers: keep the tensors it
    was made from alive and in place while it is used."""

    _fields_ = [("kind", _i32), ("f16", _i32), ("group", _i64), ("N", _i64), ("K", _i64), ("codes", _p),
                ("scales", _p), ("mins", _p), ("bias", _p), ("bf16_min_rows", _i64)]


class Activation(IntEnum):
    """`activation_t`: the layer stack's MLP activation."""

    ACT_SILU = 0
    ACT_GELU_TANH = 1


class RopeTables(IntEnum):
    """`rope_tables_t`: which rotary tables a layer of the stack takes."""

    ROPE_NONE = 0
    ROPE_GLOBAL = 1
    ROPE_LOCAL = 2


class KvDtype(IntEnum):
    """`kv_dtype_t`: the element type of the paged K/V caches."""

    KV_F32 = 0
    KV_BF16 = 1
    KV_F16 = 2
    KV_Q8 = 3


class Experts(ctypes.Structure):
    """`experts_t`: a layer's mixture of experts (its router and each expert's two WeightDescs)."""

    _fields_ = [("router", _p), ("gate_up", _p), ("down", _p), ("gemm_min", _i64 * 2), ("num_experts", _i32),
                ("top_k", _i32), ("normalize", _i32)]


class Layer(ctypes.Structure):
    """`layer_t`: one decoder layer of the fused stack (pointers to its WeightDescs, norms and K/V caches;
    a NULL norm is one the layer does not have; gate_up and down NULL where `experts` is not)."""

    _fields_ = [("qkv", _p), ("o", _p), ("gate_up", _p), ("down", _p), ("gemm_min", _i64 * 4),
                ("input_norm", _p), ("post_norm", _p), ("attn_out_norm", _p), ("mlp_out_norm", _p),
                ("q_norm", _p), ("k_norm", _p), ("qk_norm_per_head", _i32), ("rope", _i32),
                ("residual_scale", _f32), ("k_cache", _p), ("v_cache", _p), ("experts", _p), ("rope_dim", _i64),
                ("kv_dtype", _i32), ("k_scales", _p), ("v_scales", _p), ("lora", _p * 4)]


class Lora(ctypes.Structure):
    """`lora_t`: one linear's LoRA adapters in every slot (tgi_llm/lora/weights.py LinearLora)."""

    _fields_ = [("parts", _i64), ("rank", _i64), ("K", _i64), ("N", _i64), ("offsets", _p), ("ranks", _p),
                ("a", _p), ("bt", _p)]


class Prompts(ctypes.Structure):
    """`prompts_t`: the prompt chunks of a step and the prefill kernel that runs them (S = 0: none)."""

    _fields_ = [("run", _p), ("S", _i64), ("trow", _p), ("qstart", _p), ("qlen", _p), ("klen", _p)]


C_NAMES = {WeightDesc: "qweight_t", Layer: "layer_t", Prompts: "prompts_t", Experts: "experts_t", Lora: "lora_t"}

_PREFILL = ([_p, _i64, _p, _p, _p, _p, _i64] + [_p] * 4 + [_i64] * 5 + [_f32, ctypes.c_int], ctypes.c_int)
#: name: (argument types, result type) of every function Python calls.
SIGNATURES: dict[str, tuple[list, object]] = {
    "native_abi": ([], _p),
    "panel_lanes": ([], ctypes.c_int),
    "q8_panel_lanes": ([], ctypes.c_int),
    "panel_rows_per_pass": ([], ctypes.c_int),
    "amx_usable": ([], ctypes.c_int),
    "set_amx_min_rows": ([_i64, _i64, _i64], None),
    "quant_apply": ([_p, _p, _i64, _p, _i64, _i64, _i64, ctypes.c_int], None),
    "paged_decode": ([_p, _p, _p, _p, _p, _i32] + [_p] * 4 + [_i64] * 7 + [_f32, _f32, ctypes.c_int], ctypes.c_int),
    "paged_prefill_kv": ([_p, _i32, _p, _i64, _p, _p, _p, _p, _p, _p, _i64] + [_p] * 4 + [_i64] * 5
                         + [_f32, ctypes.c_int], ctypes.c_int),
    "kv_store_row": ([_p, _p, _p, _i64, _i32], None),
    "paged_prefill_f32": _PREFILL,
    "paged_prefill_bf16": _PREFILL,
    "paged_prefill_amx": _PREFILL,
    "has_bf16_prefill": ([], ctypes.c_int),
    "has_amx_prefill": ([], ctypes.c_int),
    "set_amx_prefill": ([ctypes.c_int], None),
    "lora_apply": ([_p, _p, _i64, _p, _i64, _p, _i64, ctypes.c_int], None),
    "layer_stack": ([_p, _i64, _p, _p, _p, _p, _p] + [_i64] * 6 + [_p] * 6 + [_i64] * 2 + [_p] + [_i64] * 2
                    + [_f32] * 3 + [_i32, ctypes.c_int], ctypes.c_int),
}


class _Entry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", _i64)]


#: Built only where the CPU has AVX512-BF16 (has_bf16_prefill() says whether they are there).
OPTIONAL = frozenset({"paged_prefill_bf16", "paged_prefill_amx"})


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare every signature of SIGNATURES on `lib`."""
    for name, (argtypes, restype) in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            if name in OPTIONAL:
                continue
            raise
        fn.argtypes, fn.restype = argtypes, restype
    return lib


def expected_abi() -> dict[str, int]:
    """What `native_abi` must report: the mirrors' sizes and field offsets, the enums' values, the int8 KV
    cache's group."""
    want = {}
    for struct, c_name in C_NAMES.items():
        want[f"sizeof({c_name})"] = ctypes.sizeof(struct)
        want.update({f"{c_name}.{field}": getattr(struct, field).offset for field, _ in struct._fields_})
    want.update({value.name: int(value) for enum in (WeightKind, Activation, RopeTables, KvDtype) for value in enum})
    want["KV_Q8_GROUP"] = Q8_GROUP  # the int8 cache's layout, written by both sides
    return want


def library_abi(lib: ctypes.CDLL) -> dict[str, int]:
    """The `native_abi` table of a bound library."""
    entries = ctypes.cast(lib.native_abi(), ctypes.POINTER(_Entry))
    found, i = {}, 0
    while entries[i].name is not None:
        found[entries[i].name.decode()] = entries[i].value
        i += 1
    return found


def check_abi(lib: ctypes.CDLL) -> None:
    """Raise AbiMismatch naming every struct size, field offset or enum value that differs."""
    want, found = expected_abi(), library_abi(lib)
    wrong = [f"{k}: C {found.get(k, 'missing')}, Python {want.get(k, 'missing')}"
             for k in sorted(want.keys() | found.keys()) if want.get(k) != found.get(k)]
    if wrong:
        raise AbiMismatch("the kernels library and tgi_llm/native/abi.py disagree: " + "; ".join(wrong))
