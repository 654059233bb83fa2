"""The memory account: weights counted once (tied, quantized, packed), the KV pool backed only as used."""

from __future__ import annotations

import torch

from tgi_llm.kv_cache import allocate_kv_cache
from tgi_llm.memory import account, resident_bytes, weight_bytes
from tgi_llm.models import load_model
from tgi_llm.quant.modes import Quantization


def test_quantized_weights_count_their_codes_and_a_tied_head_once(tiny_model_factory):
    model_dir = tiny_model_factory("llama", tie_word_embeddings=True)
    flt, config = load_model(model_dir, quantization=Quantization("float"))
    q8, _ = load_model(model_dir, quantization=Quantization("int8", 32))
    q4, _ = load_model(model_dir, quantization=Quantization("int4", 32))
    params = sum(p.numel() for p in flt.parameters())  # the tied head is one parameter
    assert weight_bytes(flt) >= params * 4
    linear_floats = sum(m.dense_weight().numel() for m in q8.modules() if hasattr(m, "qweight"))
    # int8 codes + a float16 scale per 32 weights; int4 half that; the rest (norms, rope tables) is shared
    assert weight_bytes(q8) - weight_bytes(q4) >= linear_floats * 0.4
    assert weight_bytes(flt) - weight_bytes(q8) >= linear_floats * 2.5
    assert q8.lm_head_quant.qweight.codes.data_ptr() == q8.embed_quant.codes.data_ptr()  # one copy serves both


def test_the_kv_pool_costs_memory_only_where_used(tiny_model_factory):
    model, config = load_model(tiny_model_factory("llama"))
    caches = allocate_kv_cache(config, num_blocks=4096, block_size=16)
    k = caches[0][0]
    before = account(model, caches)
    assert before.kv_cache == sum(t.numel() * 4 for pair in caches for t in pair)
    assert before.kv_cache_resident < before.kv_cache / 10
    k[:64] = 1.0
    assert resident_bytes(k) >= k[:64].numel() * 4
    assert torch.equal(k[64:128], torch.zeros_like(k[64:128]))  # fresh memory reads as zeros
    assert account(model, caches).other >= 0


def test_the_engine_hands_load_time_garbage_back_before_serving(tiny_llama_dir, monkeypatch):
    """Quantizing on load frees float copies into glibc's heap; the builder trims it before the first request."""
    import tgi_llm.memory
    from tgi_llm import LLM

    trims = []
    monkeypatch.setattr(tgi_llm.memory, "libc_trim", lambda: lambda: trims.append(1) or 1)
    with LLM(str(tiny_llama_dir), quantize="int8", kv_cache_memory_gb=0.01) as llm:
        assert trims == [1]
        assert llm.generate([[1, 5, 7]], {"max_new_tokens": 2, "ignore_eos": True})[0].generated_tokens == 2


def _file_mappings(path) -> list[tuple[int, int]]:
    spans = []
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            if line.rstrip().endswith(str(path)):
                start, end = line.split()[0].split("-")
                spans.append((int(start, 16), int(end, 16)))
    return spans


def test_a_quantized_model_keeps_nothing_of_its_float_file_mapped(tiny_model_factory):
    """A norm weight left as a view of safetensors' mapping would keep the whole float file resident."""
    model_dir = tiny_model_factory("llama")
    model, _ = load_model(model_dir, quantization=Quantization("int8", 32))
    spans = _file_mappings(model_dir.resolve() / "model.safetensors")
    kept = [name for name, p in model.named_parameters() if any(a <= p.data_ptr() < b for a, b in spans)]
    assert kept == []
    assert model.layers[0].input_norm.weight.abs().sum() > 0  # the copies hold the values
