"""GGUF block types as the kernels' layouts: dequantized bit for bit as gguf-py dequantizes them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from tgi_llm.quant.gguf_blocks import BLOCKS, from_gguf_blocks  # noqa: E402


def random_blocks(kind: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes in the block layout, with sane float16 scales (K-quants have no quantizer in gguf-py)."""
    per, size = BLOCKS[kind]
    raw = rng.integers(0, 256, size=(rows, k // per, size), dtype=np.uint8)
    for off in {"Q4_K": (0, 2), "Q6_K": (208,)}[kind]:  # d (and Q4_K's dmin)
        d = rng.uniform(1e-3, 5e-2, size=(rows, k // per, 1)).astype(np.float16)
        raw[..., off:off + 2] = d.view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_dequantizes_exactly_as_gguf_py(kind):
    rng = np.random.default_rng(0)
    rows, k = 6, 512
    qtype = getattr(GGMLQuantizationType, kind)
    if kind in ("Q4_0", "Q4_1", "Q8_0"):
        raw = quantize(rng.standard_normal((rows, k)).astype(np.float32), qtype)
    else:
        raw = random_blocks(kind, rows, k, rng)
    want = torch.from_numpy(dequantize(raw, qtype).reshape(rows, k).astype(np.float32))
    w = from_gguf_blocks(kind, raw, rows, k)
    assert w.shape == (rows, k) and w.source == kind
    assert torch.equal(w.dequantize(), want)
    assert w.nbytes <= raw.nbytes * 1.7  # codes stay codes: no float copy


def test_unsupported_type_and_ragged_rows_are_refused():
    with pytest.raises(ValueError, match="Q5_K has no kernel"):
        from_gguf_blocks("Q5_K", np.zeros((1, 176), np.uint8), 1, 256)
    with pytest.raises(ValueError, match="not a multiple"):
        from_gguf_blocks("Q4_1", np.zeros((1, 20), np.uint8), 1, 48)
