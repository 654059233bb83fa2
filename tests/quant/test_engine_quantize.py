"""--quantize through the engine: each mode serves, bad combinations fail at start-up naming the flag."""

from __future__ import annotations

import pytest

from tgi_llm import LLM
from tgi_llm.quant.linear import QuantLinear


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
    ({"quantize": "int4", "dtype": "bfloat16"}, "float32 activations"),
    ({"quantize": "int4", "quantize_group_size": 96}, "does not divide the input size"),
])
def test_bad_combinations_fail_at_start_up(tiny_llama_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(tiny_llama_dir), kv_cache_memory_gb=0.01, **kwargs)


def test_unset_quantize_dequantizes_a_gguf_where_its_kernels_do_not_apply(default_model_dir):
    """A GPU or `--dtype bfloat16` with the default (GGUF) model starts on floats, not with an error."""
    import torch

    from tgi_llm.models.llama import Linear, load_model
    from tgi_llm.quant.modes import Quantization

    model, _ = load_model(default_model_dir, dtype=torch.bfloat16)
    assert model.lm_head_quant is None and not any(isinstance(m, QuantLinear) for m in model.modules())
    # on the CPU: the decoder linears in bfloat16 for the C kernels' bfloat16 GEMM, the rest float32
    linear_dtypes = {m.weight.dtype for m in model.modules() if isinstance(m, Linear)}
    if model.float_kernels is not None:
        assert linear_dtypes == {torch.bfloat16} and model.dtype == torch.float32
    else:
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="float32 activations"):
        load_model(default_model_dir, dtype=torch.bfloat16, quantization=Quantization("gguf"))
