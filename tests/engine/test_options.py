"""EngineOptions: --kv-cache-dtype by name, from the model's config parameters."""

from __future__ import annotations

import pytest

from tgi_llm.engine.options import KV_CACHE_DTYPES, EngineOptions


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_each_kv_cache_dtype_passes_from_the_config_parameters(name):
    assert EngineOptions.from_parameters({"kv_cache_dtype": name}).kv_cache_dtype == name


def test_an_unset_kv_cache_dtype_is_auto():
    assert EngineOptions.from_parameters({"kv_cache_dtype": ""}).kv_cache_dtype is None
    assert EngineOptions().kv_cache_dtype is None


@pytest.mark.parametrize("name", ["int3", "fp8", "bf16", "Float16"])
def test_an_unknown_kv_cache_dtype_is_refused_naming_the_option_and_the_choices(name):
    with pytest.raises(ValueError, match=rf"`kv_cache_dtype` must be one of auto, float32, bfloat16, float16, int8\. "
                                         rf"Given: {name}"):
        EngineOptions.from_parameters({"kv_cache_dtype": name})
