"""The LoRA product: the C kernel (lora.c) against the torch one, rows of several adapters and of the base
model in one batch, parts of different ranks."""

from __future__ import annotations

import ctypes

import torch

from tgi_llm.lora.peft_adapter import AdapterPart
from tgi_llm.lora.weights import LinearLora, LoraBatch


def _linear(seed: int) -> LinearLora:
    gen = torch.Generator().manual_seed(seed)
    lora = LinearLora(3, (48, 16, 16), 8, 64, torch.device("cpu"), torch.float32)
    for slot, ranks in enumerate([(8, 4, 0), (2, 2, 2), (0, 0, 5)]):
        for part, r in enumerate(ranks):
            if r:
                lora.set(slot, AdapterPart(0, "qkv", part, torch.randn(r, 64, generator=gen),
                                           torch.randn(lora.widths[part], r, generator=gen)))
    return lora


def _reference(lora: LinearLora, x: torch.Tensor, slots: list[int]) -> torch.Tensor:
    y = torch.zeros(x.shape[0], lora.out_features, dtype=torch.float64)
    for row, slot in enumerate(slots):
        if slot < 0:
            continue
        for part, r in enumerate(lora.ranks[slot].tolist()):
            first, n = int(lora.offsets[part]), lora.widths[part]
            a = lora.a[slot, part, :r].double()
            bt = lora.bt[slot, lora.max_rank * first: lora.max_rank * (first + n)].view(lora.max_rank, n)[:r]
            y[row, first:first + n] += (x[row].double() @ a.t()) @ bt.double()
    return y


def test_torch_and_c_products_match_a_float64_reference(c_kernels):
    from tgi_llm.native import library

    lora = _linear(0)
    slots = [0, -1, 2, 1, 1, 0, -1, 2]
    x = torch.randn(len(slots), 64, generator=torch.Generator().manual_seed(1))
    want = _reference(lora, x, slots)
    batch = LoraBatch.of(slots)
    got = torch.zeros(len(slots), lora.out_features)
    lora.add(x, got, batch)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    out = torch.zeros(len(slots), lora.out_features)
    library().lora_apply(ctypes.addressof(lora.struct), x.data_ptr(), 64, out.data_ptr(), lora.out_features,
                         batch.rows.data_ptr(), len(slots), 2)
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
    assert out[1].abs().max() == 0 and out[6].abs().max() == 0  # base rows untouched


def test_a_cleared_slot_changes_nothing():
    lora = _linear(0)
    lora.clear(0)
    x = torch.randn(2, 64)
    y = torch.zeros(2, lora.out_features)
    lora.add(x, y, LoraBatch.of([0, 0]))
    assert y.abs().max() == 0
    assert LoraBatch.of([-1, -1]) is None
