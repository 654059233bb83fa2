"""The 16- and 8-bit KV caches against the float32 one, teacher-forced on held-out text: the issue's thresholds on
the default model, and the measurement itself on a random tiny checkpoint."""

from __future__ import annotations

import pytest
import torch

from tgi_llm.kv_accuracy import NextTokenStats, agreement, sequence_stats
from tgi_llm.models import load_model
from tgi_llm.quant.accuracy import held_out_sequences

pytestmark = pytest.mark.usefixtures("c_kernels")  # the kernels read the 16-bit caches, as the server's do


@pytest.fixture(scope="module")
def default_model(default_model_dir):
    from transformers import AutoTokenizer

    model, _ = load_model(default_model_dir)
    seqs = held_out_sequences(AutoTokenizer.from_pretrained(default_model_dir), 2, 512)
    return model, seqs, [sequence_stats(model, s, torch.float32) for s in seqs]


@pytest.mark.slow
@pytest.mark.parametrize(("kv_dtype", "top1", "logprob"),
                         [(torch.bfloat16, 0.995, 0.02), (torch.float16, 0.995, 0.005), (torch.int8, 0.99, 0.04)])
def test_a_16_or_8_bit_cache_agrees_with_float32_on_the_default_model(default_model, kv_dtype, top1, logprob):
    """At 512 tokens, the issue's thresholds (tools/kv_cache_accuracy.py on 2,044 positions: 99.95% / 0.0056
    for bfloat16, 100% / 0.0007 for float16, 99.1% / 0.017 for int8); a cache read as the wrong type, or not
    rounded where the prompt is, would not agree."""
    model, seqs, reference = default_model
    result = agreement(reference, [sequence_stats(model, s, kv_dtype) for s in seqs])
    assert result.positions == 2 * 511
    assert result.top1_agreement >= top1 and result.mean_abs_logprob_diff <= logprob
    assert result.mean_abs_logprob_diff > 0  # the cache really held rounded values


@pytest.mark.parametrize(("kv_dtype", "top1", "logprob"),
                         [(torch.bfloat16, 0.98, 0.01), (torch.float16, 0.98, 0.01), (torch.int8, 0.97, 0.03)])
def test_a_16_or_8_bit_cache_stays_close_on_a_random_tiny_model(tiny_model_factory, kv_dtype, top1, logprob):
    """A random model's logits are flatter than a trained one's, so rounding flips more near-ties."""
    model, _ = load_model(tiny_model_factory("llama", max_position_embeddings=1024))
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (300, 700)]
    reference = [sequence_stats(model, s, torch.float32) for s in seqs]
    result = agreement(reference, [sequence_stats(model, s, kv_dtype) for s in seqs])
    assert result.positions == 299 + 699
    assert result.top1_agreement >= top1 and 0 < result.mean_abs_logprob_diff <= logprob


def test_agreement_counts_every_position():
    ref = NextTokenStats(torch.tensor([1, 2, 3, 4]), torch.tensor([-1.0, -2.0, -3.0, -4.0]))
    got = NextTokenStats(torch.tensor([1, 2, 0, 4]), torch.tensor([-1.5, -2.0, -3.0, -3.5]))
    result = agreement([ref, ref], [got, ref])
    assert result.positions == 8
    assert result.top1_agreement == 7 / 8
    assert result.mean_abs_logprob_diff == pytest.approx(1.0 / 8)


def test_stats_are_the_logits_next_token_view(tiny_model_factory):
    """sequence_stats' argmax and logprob are the full logits' (computed in row chunks)."""
    from tgi_llm.quant.accuracy import sequence_logits

    model, config = load_model(tiny_model_factory("llama"))
    ids = torch.randint(3, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    logits = sequence_logits(model, config, ids)[:-1].log_softmax(-1)
    stats = sequence_stats(model, ids, torch.float32)
    assert torch.equal(stats.argmax, logits.argmax(-1))
    torch.testing.assert_close(stats.logprob, logits.gather(1, torch.tensor(ids[1:])[:, None])[:, 0])
