"""The fused layer stack (one C call for every layer of a decode or mixed step) against the torch layers."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from tgi_llm.kv_cache import cache_of, kv_scales
from tgi_llm.models.layer_stack import FusedLayerStack
from tgi_llm.models.loader import load_model
from tgi_llm.quant.linear import FLOAT_GEMM_MIN_TOKENS, GEMM_MIN_TOKENS, Q8_GEMM_MIN_TOKENS
from tgi_llm.quant.modes import Quantization

pytestmark = [pytest.mark.usefixtures("c_kernels"),  # fails, never skips, without a compiler
              pytest.mark.usefixtures("prefill_kernel_chosen")]  # mixed steps on every machine


def _forward(model, kv, step):
    ids, positions, attn = step
    return model(ids, positions, kv, attn)


def _caches(model, num_blocks=96, block_size=4, dtype=torch.float32):
    first = model.layers[0]
    shape = (num_blocks, block_size, first.num_kv_heads, first.head_dim)
    return [(cache_of(torch.zeros(shape), dtype), cache_of(torch.zeros(shape), dtype)) for _ in model.layers]


def _steps(rng: random.Random, rows: int):
    """Prompts of different lengths, decode steps of 1 and of `rows` sequences, a step that mixes a new
    prompt with decodes (the torch layers then read K/V the fused stack wrote), decodes again, and a step
    where some sequences verify draft tokens (short runs after the decodes: decode rows)."""
    prompts = [(i, [rng.randrange(3, 250) for _ in range(3 + 4 * (i % 8))]) for i in range(rows)]
    yield prompts
    for _ in range(2):
        yield [(0, [rng.randrange(3, 250)])]
        yield [(i, [rng.randrange(3, 250)]) for i in range(rows)]
    yield [(rows, [rng.randrange(3, 250) for _ in range(6)])] + [(i, [rng.randrange(3, 250)]) for i in range(rows)]
    for _ in range(2):
        yield [(i, [rng.randrange(3, 250)]) for i in range(rows + 1)]
    yield [(i, [rng.randrange(3, 250) for _ in range(1 if i % 2 else 1 + i % 5)]) for i in range(rows + 1)]
    yield [(i, [rng.randrange(3, 250)]) for i in range(rows + 1)]


def _fused_and_torch_steps(fused, reference, fused_kv, reference_kv, batcher, steps, use_settings, tolerance):
    """Each step through the fused stack and through the torch layers (each over its own caches), outputs
    equal within `tolerance` (rtol, atol); returns how many steps were pure decodes."""
    decode_steps = 0
    for chunks in steps:
        ids, positions, attn = batcher.step(chunks)
        got = fused(ids, positions, fused_kv, attn)
        use_settings(fused_decode=False)
        want = reference(ids, positions, reference_kv, attn)
        use_settings(fused_decode=True)
        torch.testing.assert_close(got, want, rtol=tolerance[0], atol=tolerance[1])
        decode_steps += attn.is_pure_decode
    return decode_steps


@pytest.mark.parametrize(("model_type", "mode"), [("llama", "int4"), ("llama", "int8"), ("qwen2", "int4"),
                                               ("llama", "float"), ("qwen2", "float")])
@pytest.mark.parametrize("rows", [3, GEMM_MIN_TOKENS + 1, Q8_GEMM_MIN_TOKENS + 1, FLOAT_GEMM_MIN_TOKENS + 1])
def test_decode_steps_match_the_torch_layers(tiny_model_factory, paged_batcher, use_settings, model_type, mode, rows):
    """At rows where each weight kind takes its decode kernel, and its GEMM."""
    if rows == FLOAT_GEMM_MIN_TOKENS + 1 and mode != "float":
        pytest.skip("the quantized GEMMs already run at fewer rows")
    use_settings(float_linears="c")  # float32 weights on the C kernels on any CPU
    model_dir = tiny_model_factory(model_type)  # qwen2: q/k/v biases, which quant_apply adds
    fused, _ = load_model(model_dir, quantization=Quantization(mode))
    reference, _ = load_model(model_dir, quantization=Quantization(mode))
    fused_kv, reference_kv = _caches(fused, num_blocks=512), _caches(reference, num_blocks=512)
    batcher = paged_batcher(block_size=4, num_blocks=512)
    decode_steps = _fused_and_torch_steps(fused, reference, fused_kv, reference_kv, batcher,
                                          _steps(random.Random(rows), rows), use_settings, (1e-4, 1e-5))
    stack = fused._fused[1]
    assert isinstance(stack, FusedLayerStack) and stack.agrees is True  # it ran (and its first steps were checked)
    assert stack.checked == {"decode", "mixed", "verify"}
    assert reference._fused[1] is None
    for (k1, v1), (k2, v2) in zip(fused_kv, reference_kv, strict=True):  # the K/V it wrote, in the same slots
        torch.testing.assert_close(k1, k2, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v1, v2, rtol=1e-4, atol=1e-5)
    assert decode_steps == 7


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float16, torch.int8])
def test_a_16_or_8_bit_cache_matches_the_torch_layers(tiny_model_factory, paged_batcher, use_settings, kv_dtype):
    """The stack rounds the K/V it writes to the cache's type as torch's cast does (int8: the codes and
    scales kv_cache.quantize_q8 computes), decode reads them in place and prompt chunks through converted
    copies. Its norms and rope round like torch's only up to ~1e-6, which can flip a rounding now and then
    (5e-5 in the outputs on the AVX2 build); a wrong kernel differs by the values' size."""
    use_settings(float_linears="c")
    model_dir = tiny_model_factory("llama")
    fused, _ = load_model(model_dir, quantization=Quantization("int8"))
    reference, _ = load_model(model_dir, quantization=Quantization("int8"))
    fused_kv, reference_kv = (_caches(m, num_blocks=512, dtype=kv_dtype) for m in (fused, reference))
    batcher = paged_batcher(block_size=4, num_blocks=512)
    _fused_and_torch_steps(fused, reference, fused_kv, reference_kv, batcher, _steps(random.Random(7), 3),
                           use_settings, (1e-3, 1e-3))
    stack = fused._fused[1]
    assert isinstance(stack, FusedLayerStack) and stack.checked == {"decode", "mixed", "verify"}
    for (k1, v1), (k2, v2) in zip(fused_kv, reference_kv, strict=True):
        assert k1.dtype == kv_dtype and k1.abs().sum() > 0
        if kv_dtype == torch.int8:  # codes one step apart at most, and the same but for a rare flip
            for a, b in ((k1, k2), (v1, v2)):
                assert (a.int() - b.int()).abs().max() <= 1 and (a == b).float().mean() > 0.999
                torch.testing.assert_close(kv_scales(a), kv_scales(b), rtol=2e-3, atol=0)
            continue
        # one rounding step apart at most: the stack's norms and rope round like torch's only up to ~1e-6
        torch.testing.assert_close(k1.float(), k2.float(), rtol=1e-2, atol=1e-3)
        torch.testing.assert_close(v1.float(), v2.float(), rtol=1e-2, atol=1e-3)


def test_a_stack_that_disagrees_is_switched_off(tiny_model_factory, paged_batcher, monkeypatch, caplog):
    model, _ = load_model(tiny_model_factory("llama"), quantization=Quantization("int4"))
    kv = _caches(model)
    batcher = paged_batcher(block_size=4, num_blocks=96)
    _forward(model, kv, batcher.step([(0, [5, 6, 7])]))
    calls = []

    def wrong(self, hidden, rope, attn, lora=None):
        calls.append(hidden.shape[0])
        return torch.zeros_like(hidden)

    monkeypatch.setattr(FusedLayerStack, "_run", wrong)
    with caplog.at_level(logging.WARNING, logger="tgi_llm.models.layer_stack"):
        first = _forward(model, kv, batcher.step([(0, [8])]))
    assert calls == [1] and first.abs().sum() > 0  # checked, and the torch result served
    assert any("disagrees" in m for m in caplog.messages)
    _forward(model, kv, batcher.step([(0, [9])]))
    assert calls == [1]  # not asked again


def test_onednn_packed_float_weights_keep_the_torch_layers(tiny_model_factory, paged_batcher, use_settings):
    use_settings(float_linears="onednn")
    model, _ = load_model(tiny_model_factory("llama"))
    assert model.float_kernels is None
    kv = _caches(model)
    batcher = paged_batcher(block_size=4, num_blocks=96)
    _forward(model, kv, batcher.step([(0, [5, 6, 7])]))
    _forward(model, kv, batcher.step([(0, [8])]))
    assert model._fused == (kv, None)


def test_the_engine_uses_it_and_closing_frees_the_caches_it_holds(tiny_llama_dir):
    from tgi_llm import LLM

    with LLM(str(tiny_llama_dir), quantize="int4", kv_cache_memory_gb=0.01) as llm:
        model = llm.engine.runner.model
        out = llm.generate([[1, 5, 7, 9], [1, 8]], {"max_new_tokens": 5, "ignore_eos": True})
        assert [len(o.token_ids) for o in out] == [5, 5]
        caches, stack = model._fused
        assert stack is not None and stack.agrees is True and caches is llm.engine.runner.kv_caches
    assert model._fused is None


def test_a_step_with_a_decode_after_a_prompt_chunk_keeps_the_torch_layers(tiny_model_factory, paged_batcher,
                                                                          monkeypatch, use_settings):
    model, _ = load_model(tiny_model_factory("llama"), quantization=Quantization("int4"))
    reference, _ = load_model(tiny_model_factory("llama"), quantization=Quantization("int4"))
    kv, reference_kv = _caches(model), _caches(reference)
    batcher = paged_batcher(block_size=4, num_blocks=96)
    for chunks in ([(0, list(range(5, 15))), (1, list(range(9, 19)))], [(0, [8]), (1, [11])]):  # prompts, decodes
        ids, positions, attn = batcher.step(chunks)
        model(ids, positions, kv, attn)
        reference(ids, positions, reference_kv, attn)
    stack = model._fused[1]
    assert stack.checked == {"decode", "mixed"}
    calls = []
    monkeypatch.setattr(FusedLayerStack, "_run", lambda self, *a: calls.append(1))
    ids, positions, attn = batcher.step([(2, list(range(3, 15))), (0, [12])])  # the decode comes second
    got = model(ids, positions, kv, attn)
    use_settings(fused_decode=False)
    want = reference(ids, positions, reference_kv, attn)
    assert calls == [] and torch.equal(got, want)  # the torch layers, exactly as with the stack off
