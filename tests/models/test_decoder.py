"""The paged decoder (Llama, Mistral, Qwen2 checkpoints) against transformers' eager implementation."""

from __future__ import annotations

import pytest
import torch

from tests.models.parity import (
    PagedRun,
    assert_schedule_matches,
    random_prompts,
    reference_logits,
    reference_model,
    rel_err,
)
from tgi_llm.attention.cpu_kernels import cpu_attention_kernels
from tgi_llm.kv_cache import allocate_kv_cache
from tgi_llm.models import load_model
from tgi_llm.models.layers.linear import Linear
from tgi_llm.quant.kernels import quant_kernels

torch.set_num_threads(2)


VARIANTS = {
    "llama-untied": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "qwen2-qkv-bias": ("qwen2", {}),
    "mistral": ("mistral", {"sliding_window": None}),
    "llama-attention-and-mlp-bias": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "rope-linear": (
        "llama",
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}},
    ),
    "rope-llama3": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
                "rope_theta": 10000.0,
            }
        },
    ),
    "rope-yarn": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "rope_theta": 10000.0,
            }
        },
    ),
    # max_position_embeddings below the longest prompt, so the dynamic base actually changes
    "rope-dynamic": (
        "llama",
        {
            "max_position_embeddings": 16,
            "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
        },
    ),
}


@pytest.fixture(params=["c", "onednn"])
def float_linears(request, use_settings):
    """Both float32 linear paths: the C kernels (the default) and oneDNN (TGI_LLM_FLOAT_LINEARS=onednn)."""
    use_settings(float_linears=request.param)
    return request.param


def load_float_model(model_dir, float_linears):
    model, config = load_model(model_dir)
    on_kernels = model.float_kernels is not None
    assert on_kernels == (float_linears == "c" and quant_kernels() is not None)
    assert (model.lm_head_packed is not None) == (float_linears == "onednn")  # held once either way
    assert (model.lm_head_panel_lanes > 0) == on_kernels  # the tiny vocab (256) fills whole panels
    return model, config


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_batch_matches_transformers(tiny_model_factory, paged_batcher, variant, float_linears):
    model_type, overrides = VARIANTS[variant]
    model_dir = tiny_model_factory(model_type, **overrides)
    model, config = load_float_model(model_dir, float_linears)
    ref = reference_model(model_dir)
    prompts = random_prompts([1, 5, 13, 30], config.vocab_size)
    run = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=32))
    got = run.step(list(enumerate(prompts)))
    for prompt, logits in zip(prompts, got, strict=True):
        assert rel_err(logits, reference_logits(ref, prompt)) < 1e-4


def test_a_linear_the_kernels_cannot_take_sends_every_linear_to_onednn(tiny_model_factory, paged_batcher):
    """down_proj's in_features (136) is not a multiple of 16: no linear may be left in the panel order."""
    model_dir = tiny_model_factory("llama", intermediate_size=136)
    model, config = load_model(model_dir)
    assert model.float_kernels is None
    assert all(m.panel_lanes == 0 and m.kernels is None for m in model.modules() if isinstance(m, Linear))
    prompts = random_prompts([5, 13], config.vocab_size)
    got = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=32)).step(list(enumerate(prompts)))
    ref = reference_model(model_dir)
    for prompt, logits in zip(prompts, got, strict=True):
        assert rel_err(logits, reference_logits(ref, prompt)) < 1e-4


def test_decode_after_prefill_matches_full_sequence(tiny_model_factory, paged_batcher, float_linears):
    """Prefill, chunked prefill and decodes mixed over several steps: each new token's logits equal
    transformers' logits at that position of the whole sequence."""
    model_dir = tiny_model_factory("llama")
    model, config = load_float_model(model_dir, float_linears)
    ref = reference_model(model_dir)
    full = random_prompts([20, 14, 11], config.vocab_size, seed=1)
    # per step: (sequence, how many of its next tokens)
    schedule = [
        [(0, 8), (1, 6)],
        [(0, 1), (1, 5), (2, 9)],
        [(0, 4), (1, 1), (2, 1)],
        [(0, 1), (1, 1), (2, 1)],
        [(0, 6), (1, 1)],
    ]
    run = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=32))
    assert_schedule_matches(run, ref, full, schedule)


def test_mixed_batch_equals_separate_runs(tiny_model_factory, paged_batcher):
    """A sequence's logits do not depend on what else is in the batch."""
    model, config = load_model(tiny_model_factory("llama"))
    a, b, c = random_prompts([11, 6, 3], config.vocab_size, seed=2)
    mixed = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=32, seed=3))
    mixed.step([(1, b[:5])])
    mixed_out = mixed.step([(0, a), (1, b[5:]), (2, c)])  # prefill, decode, prefill together

    alone_a = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=32, seed=4)).step([(0, a)])[0]
    run_b = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=32, seed=5))
    run_b.step([(1, b[:5])])
    alone_b = run_b.step([(1, b[5:])])[0]
    alone_c = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=32, seed=6)).step([(2, c)])[0]
    for got, alone in zip(mixed_out, [alone_a, alone_b, alone_c], strict=True):
        torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)


def test_bfloat16_runs_close_to_float32(tiny_model_factory, paged_batcher):
    model_dir = tiny_model_factory("llama")
    prompts = random_prompts([7, 12], 256, seed=7)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        model, config = load_model(model_dir, dtype=dtype)
        run = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=16))
        run.caches = allocate_kv_cache(config, 16, 4, dtype=model.dtype)  # bfloat16 on the CPU: float32 layers
        out[dtype] = torch.cat(run.step(list(enumerate(prompts))))
        if dtype == torch.bfloat16 and model.float_kernels is not None:  # the CPU's bfloat16 GEMM took them
            assert {m.weight.dtype for m in model.layers.modules() if isinstance(m, Linear)} == {torch.bfloat16}
            # and prompt attention takes bfloat16 products where the CPU has them
            kernels = cpu_attention_kernels()
            assert model.bf16_prefill_attention == (kernels is not None and kernels.bf16_prefill_address is not None)
            assert run.model.attention_backend.bf16_prefill == model.bf16_prefill_attention
            # the LM head too, in the panel order where the vocabulary fills whole panels
            assert model.lm_head.dtype == (torch.bfloat16 if model.lm_head_panel_lanes else torch.float32)
        else:
            assert not model.bf16_prefill_attention
    assert out[torch.bfloat16].dtype == torch.float32  # logits are float32 whatever the model dtype
    assert 0 < rel_err(out[torch.bfloat16], out[torch.float32]) < 0.05


@pytest.mark.slow
def test_default_model_matches_transformers(default_model_dir, paged_batcher):
    """The real SmolLM2: a batch of chat prompts, then greedy decode steps for all of them at once,
    against transformers' logits over each whole sequence."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    model, config = load_model(default_model_dir)
    ref = reference_model(default_model_dir)
    questions = ["Hi", "What is the capital of France?", "Write a haiku about the sea, please, with a title."]
    seqs = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        for q in questions
    ]
    seqs = [list(s["input_ids"]) if hasattr(s, "keys") else list(s) for s in seqs]  # BatchEncoding in v5
    assert len({len(s) for s in seqs}) == 3
    run = PagedRun(model, config, paged_batcher(block_size=16, num_blocks=64))
    got = [[x] for x in run.step(list(enumerate(seqs)))]
    for _ in range(4):
        chunks = []
        for i, s in enumerate(seqs):
            s.append(int(got[i][-1][-1].argmax()))
            chunks.append((i, s[-1:]))
        for i, logits in enumerate(run.step(chunks)):
            got[i].append(logits)
    for i, s in enumerate(seqs):
        assert rel_err(torch.cat(got[i]), reference_logits(ref, s)) < 1e-4


@pytest.mark.slow
def test_tiny_llama_dir_is_a_complete_untied_model(tiny_llama_dir, paged_batcher):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model, config = load_model(tiny_llama_dir)
    assert config.vocab_size == len(tokenizer) and config.num_key_value_heads < config.num_attention_heads
    assert model.lm_head is not model.embed_tokens and not config.tie_word_embeddings
    ids = tokenizer("The tiny model speaks")["input_ids"]
    got = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=8)).step([(0, ids)])[0]
    assert rel_err(got, reference_logits(reference_model(tiny_llama_dir), ids)) < 1e-4


def test_a_quantized_model_has_no_float_linears_to_place(tiny_model_factory, caplog):
    import logging

    from tgi_llm.quant.modes import Quantization

    with caplog.at_level(logging.INFO, logger="tgi_llm.models.loader"):
        model, _ = load_model(tiny_model_factory("llama"), quantization=Quantization("int4"))
    assert model.float_kernels is None and model.lm_head_desc is None and model.lm_head_packed is None
    assert not any("float32 linears" in m or "packed for oneDNN" in m for m in caplog.messages)


@pytest.mark.parametrize("quantize", ["float", "int8"])
def test_weights_in_huge_pages_compute_what_ordinary_ones_do(tiny_model_factory, paged_batcher, monkeypatch,
                                                             use_settings, caplog, quantize):
    """Every weight the kernels stream is copied into huge pages at load (the tiny model's are all below
    MIN_BYTES, so it is lowered): the same logits, bit for bit, as with TGI_LLM_HUGE_PAGES=0."""
    import logging

    from tgi_llm import hugepages
    from tgi_llm.quant.modes import Quantization

    model_dir = tiny_model_factory("llama")
    monkeypatch.setattr(hugepages, "MIN_BYTES", 0)
    prompts = random_prompts([5, 13], 256)

    def logits():
        model, config = load_model(model_dir, quantization=Quantization(quantize, 32 if quantize == "int8" else None))
        return PagedRun(model, config, paged_batcher(block_size=4, num_blocks=32)).step(list(enumerate(prompts)))

    with caplog.at_level(logging.INFO, logger="tgi_llm.models.loader"):
        placed = logits()
    # quantized codes always move; float weights when the C kernels take them (oneDNN packs its own)
    expected = quantize == "int8" or quant_kernels() is not None
    assert any("weights in huge pages" in m for m in caplog.messages) == expected
    use_settings(huge_pages=False)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tgi_llm.models.loader"):
        ordinary = logits()
    assert not any("weights in huge pages" in m for m in caplog.messages)
    for a, b in zip(placed, ordinary, strict=True):
        assert torch.equal(a, b)
