"""GGUF's quantized block types as the kernels' layouts (formats.py), byte for byte where they agree.

Q4_0, Q4_1 and Q8_0 keep their codes and float16 scales as they are in the file (only the interleaved
block header is split off); Q4_K and Q6_K are unpacked from their 256-weight super-blocks into per-32 /
per-16 groups with float32 scales. Unpacking follows gguf-py's `dequantize_blocks`, and the tests check
every type's dequantized values against gguf-py's, bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

from tgi_llm.quant.formats import QuantizedWeight

#: name -> (weights per block, bytes per block)
BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q4_K": (256, 144), "Q6_K": (256, 210)}
SUPPORTED = tuple(BLOCKS)


def _f16(raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16).copy())


def _split(raw: np.ndarray, rows: int, k: int, kind: str) -> np.ndarray:
    per, size = BLOCKS[kind]
    if k % per:
        raise ValueError(f"{kind}: row length {k} is not a multiple of its block of {per}")
    return np.ascontiguousarray(raw).reshape(rows, k // per, size)


def from_gguf_blocks(kind: str, raw: np.ndarray, rows: int, k: int) -> QuantizedWeight:
    """`raw`: the tensor's bytes (uint8, rows x k / block x bytes per block) of a GGUF tensor [rows, k]."""
    if kind not in BLOCKS:
        raise ValueError(f"GGUF type {kind} has no kernel here (supported: {', '.join(SUPPORTED)})")
    b = _split(raw, rows, k, kind)
    if kind == "Q4_0":
        d = _f16(b[..., 0:2])[..., 0]
        return QuantizedWeight("q4", torch.from_numpy(b[..., 2:].reshape(rows, k // 2).copy()), d, d * -8, 32, k, kind)
    if kind == "Q4_1":
        d, m = _f16(b[..., 0:2])[..., 0], _f16(b[..., 2:4])[..., 0]
        return QuantizedWeight("q4", torch.from_numpy(b[..., 4:].reshape(rows, k // 2).copy()), d, m, 32, k, kind)
    if kind == "Q8_0":
        d = _f16(b[..., 0:2])[..., 0]
        codes = torch.from_numpy(b[..., 2:].copy().view(np.int8).reshape(rows, k))
        return QuantizedWeight("q8", codes, d, None, 32, k, kind)
    if kind == "Q4_K":
        return _q4_k(b, rows, k)
    return _q6_k(b, rows, k)


def _q4_k(b: np.ndarray, rows: int, k: int) -> QuantizedWeight:
    n = b.shape[1]  # super-blocks per row
    d = _f16(b[..., 0:2])[..., 0].float()
    dmin = _f16(b[..., 2:4])[..., 0].float()
    s = torch.from_numpy(b[..., 4:16].copy()).view(rows, n, 3, 4).int()
    lo, mid, hi = s[:, :, 0], s[:, :, 1], s[:, :, 2]
    sc = torch.cat([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], dim=-1)  # 8 sub-blocks of 32
    mn = torch.cat([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], dim=-1)
    scales = (d[..., None] * sc.float()).reshape(rows, n * 8)
    mins = -(dmin[..., None] * mn.float()).reshape(rows, n * 8)
    # 4 chunks of 32 bytes per super-block: low nibbles are sub-block 2j, high nibbles 2j + 1
    qs = torch.from_numpy(b[..., 16:].copy()).view(rows, n, 4, 32)
    sub = torch.stack([qs & 15, qs >> 4], dim=3).view(rows, n * 8, 32)  # codes per sub-block, in order
    codes = (sub[..., :16] | (sub[..., 16:] << 4)).reshape(rows, k // 2)
    return QuantizedWeight("q4", codes.contiguous(), scales.contiguous(), mins.contiguous(), 32, k, "Q4_K")


def _q6_k(b: np.ndarray, rows: int, k: int) -> QuantizedWeight:
    n = b.shape[1]
    ql = torch.from_numpy(b[..., 0:128].copy()).view(rows, n, 2, 1, 64)
    qh = torch.from_numpy(b[..., 128:192].copy()).view(rows, n, 2, 1, 32)
    sc = torch.from_numpy(b[..., 192:208].copy().view(np.int8)).float()
    d = _f16(b[..., 208:210])[..., 0].float()
    low = torch.cat([ql & 15, ql >> 4], dim=3).view(rows, n, 2, 4, 32)  # per half: 4 runs of 32
    high = torch.cat([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=3)  # [rows, n, 2, 4, 32]
    codes = ((low | (high << 4)).to(torch.int16) - 32).to(torch.int8).reshape(rows, k)
    scales = (d[..., None] * sc).reshape(rows, n * 16)
    return QuantizedWeight("q8", codes.contiguous(), scales.contiguous(), None, 16, k, "Q6_K")
