"""Item 5's thresholds on a small sample of held-out text, default model, kernels at every length."""

from __future__ import annotations

import pytest

from tgi_llm.models import load_model
from tgi_llm.quant.accuracy import compare, held_out_sequences, kernels_at_every_length, sequence_logits
from tgi_llm.quant.modes import Quantization


@pytest.fixture(scope="module")
def reference(default_model_dir):
    from transformers import AutoTokenizer

    seqs = held_out_sequences(AutoTokenizer.from_pretrained(default_model_dir), 2, 160)
    model, config = load_model(default_model_dir, quantization=Quantization("float"))
    return seqs, config, [sequence_logits(model, config, s) for s in seqs]


# int8 at the 99% and a mean |delta logprob| that symmetric-only int8 (0.037 on 4,088 positions)
# would fail: this reference is itself Q4_1 + Q8_0, whose groups int8 holds on its per-group grids.
@pytest.mark.slow
@pytest.mark.parametrize(("quantization", "top1", "logprob"), [
    (Quantization("gguf"), 0.995, 1e-3), (Quantization("int8", 32), 0.99, 0.01), (Quantization("int4", 32), 0.95, 0.1),
])
def test_agreement_with_the_float_reference(default_model_dir, reference, quantization, top1, logprob):
    seqs, config, ref = reference
    model, _ = load_model(default_model_dir, quantization=quantization)
    with kernels_at_every_length():
        got = [sequence_logits(model, config, s) for s in seqs]
    result = compare(ref, got, seqs)
    assert result.positions == 2 * 159
    assert result.top1_agreement >= top1 and result.mean_abs_logprob_diff <= logprob


def test_held_out_text_is_long_prose():
    from tgi_llm.quant.accuracy import held_out_text

    text = held_out_text()
    assert len(text) > 50_000 and text.count(". ") > 200


@pytest.mark.parametrize("quantization", [Quantization("float"), None], ids=["bfloat16 weights", "gguf codes"])
def test_bfloat16_on_the_cpu_stays_close_to_float32(default_model_dir, reference, quantization, c_kernels):
    """--dtype bfloat16 through the kernels' bfloat16 GEMM (99.39% top-1, 0.0107 on 4,088 positions);
    torch's bfloat16 everywhere measured 97.63% and 0.0367, which the logprob bound here refuses. With the
    GGUF's codes kept (no AMX), prompt rows take the same bfloat16 products from the codes."""
    import torch

    seqs, config, ref = reference
    model, _ = load_model(default_model_dir, dtype=torch.bfloat16, quantization=quantization)
    if quantization is None and model.lm_head_quant is None:
        pytest.skip("AMX: the GGUF is held as bfloat16 weights, the case above")
    if quantization is None:
        assert model.layers[0].qkv.desc().bf16_min_rows > 0
    else:
        assert model.float_kernels is not None and model.layers[0].qkv.weight.dtype == torch.bfloat16
    result = compare(ref, [sequence_logits(model, config, s) for s in seqs], seqs)
    assert result.top1_agreement >= 0.97 and result.mean_abs_logprob_diff <= 0.03
