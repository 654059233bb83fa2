"""--quantize through the engine: each mode serves, bad combinations fail at start-up naming the flag."""

from __future__ import annotations

import pytest
import torch

from tgi_llm import LLM
from tgi_llm.attention.cpu_kernels import cpu_attention_kernels
from tgi_llm.quant.kernels import quant_kernels
from tgi_llm.quant.linear import BF16_GEMM_MIN_TOKENS, QuantLinear


def kernels_have_bf16_attention() -> bool:
    attention = cpu_attention_kernels()
    return attention is not None and attention.bf16_prefill_address is not None


@pytest.mark.parametrize("mode", ["int8", "int4", "eetq"])
def test_float_checkpoint_quantized_on_load_generates(tiny_llama_dir, mode):
    with LLM(str(tiny_llama_dir), quantize=mode, kv_cache_memory_gb=0.01) as llm:
        model = llm.engine.runner.model
        assert isinstance(model.layers[0].qkv, QuantLinear) and model.lm_head_quant is not None
        out = llm.generate([[1, 5, 7, 9]], {"max_new_tokens": 6, "ignore_eos": True})[0]
        assert len(out.token_ids) == 6


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"quantize": "gguf"}, "`--quantize gguf` needs a .gguf model"),
    ({"quantize": "awq"}, "`--quantize awq` is not supported"),
    ({"quantize": "int4", "quantize_group_size": 96}, "does not divide the input size"),
])
def test_bad_combinations_fail_at_start_up(tiny_llama_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(tiny_llama_dir), kv_cache_memory_gb=0.01, **kwargs)


def test_bfloat16_on_the_cpu_keeps_quantized_codes_with_bfloat16_products(tiny_llama_dir, c_kernels):
    """`--quantize int4 --dtype bfloat16` on the CPU: the codes stay, the GEMM takes bfloat16 products."""
    with LLM(str(tiny_llama_dir), quantize="int4", dtype="bfloat16", kv_cache_memory_gb=0.01) as llm:
        model = llm.engine.runner.model
        panels = [m for m in model.layers.modules() if isinstance(m, QuantLinear) and m.qweight.order == "panel"]
        assert panels and {m.desc().bf16_min_rows for m in panels} == {BF16_GEMM_MIN_TOKENS}
        assert model.dtype == torch.float32
        out = llm.generate([list(range(1, 40))], {"max_new_tokens": 6, "ignore_eos": True})[0]
        assert len(out.token_ids) == 6


def test_quantized_weights_in_bfloat16_without_the_kernels_fail_at_start_up(tiny_llama_dir, use_settings):
    use_settings(float_linears="onednn")  # no C kernels for float linears: torch's bfloat16
    with pytest.raises(ValueError, match="float32 activations"):
        LLM(str(tiny_llama_dir), quantize="int4", dtype="bfloat16", kv_cache_memory_gb=0.01)


def test_unset_quantize_in_bfloat16_keeps_a_gguf_s_blocks_where_the_kernels_serve(default_model_dir, use_settings):
    """`--dtype bfloat16` with the default (GGUF) model on the CPU keeps its blocks (bfloat16 products from
    BF16_GEMM_MIN_TOKENS rows), except on AMX CPUs, whose tiles multiply bfloat16 weights in place; where no
    kernel serves it (a GPU, torch's linears) it starts on floats, not with an error."""
    from tgi_llm.models.layers.linear import Linear
    from tgi_llm.models.loader import load_model

    kernels = quant_kernels()
    model, _ = load_model(default_model_dir, dtype=torch.bfloat16)
    if kernels is not None and not kernels.amx:
        assert model.lm_head_quant is not None and model.lm_head_quant.desc().bf16_min_rows == BF16_GEMM_MIN_TOKENS
        assert {m.desc().bf16_min_rows for m in model.layers.modules() if isinstance(m, QuantLinear)} == {
            BF16_GEMM_MIN_TOKENS}
        assert model.dtype == torch.float32 and model.bf16_prefill_attention == kernels_have_bf16_attention()
    elif kernels is not None:  # AMX: the decoder linears in bfloat16 weights for the tiles, the rest float32
        assert model.lm_head_quant is None and not any(isinstance(m, QuantLinear) for m in model.modules())
        assert {m.weight.dtype for m in model.layers.modules() if isinstance(m, Linear)} == {torch.bfloat16}
        assert model.dtype == torch.float32
    use_settings(float_linears="onednn")
    model, _ = load_model(default_model_dir, dtype=torch.bfloat16)
    assert model.lm_head_quant is None and not any(isinstance(m, QuantLinear) for m in model.modules())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
