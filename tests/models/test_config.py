"""ModelConfig parsing from config.json dicts (transformers 5 and older formats)."""

from __future__ import annotations

import json

import pytest
import torch

from tgi_llm.kv_cache import allocate_kv_cache
from tgi_llm.models.config import kv_cache_bytes_per_token
from tgi_llm.models.registry import read_config, read_config_dir

BASE = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "eos_token_id": 2,
}


def test_llama_fields_and_defaults():
    cfg = read_config(BASE)
    assert cfg.head_dim == 576 // 9
    assert cfg.num_queries_per_kv == 3
    assert cfg.rope.theta == 100000.0 and cfg.rope.rope_type == "default"
    assert cfg.tie_word_embeddings and not cfg.qkv_bias and not cfg.o_bias
    assert cfg.eos_token_ids == (2,)


def test_explicit_head_dim_and_missing_kv_heads():
    cfg = read_config({**BASE, "head_dim": 128, "num_key_value_heads": None})
    assert cfg.head_dim == 128 and cfg.num_key_value_heads == 9


def test_qwen2_has_qkv_bias_but_no_o_bias():
    cfg = read_config({**BASE, "model_type": "qwen2", "sliding_window": 4096})
    assert cfg.qkv_bias and not cfg.o_bias
    assert cfg.sliding_windows == ()  # use_sliding_window is false by default


def test_llama_attention_bias_covers_o_proj():
    cfg = read_config({**BASE, "attention_bias": True, "mlp_bias": True})
    assert cfg.qkv_bias and cfg.o_bias and cfg.mlp_bias


def test_sliding_windows_per_layer():
    mistral = read_config({**BASE, "model_type": "mistral", "sliding_window": 4096})
    assert mistral.sliding_windows == (4096,) * BASE["num_hidden_layers"] and mistral.narrowest_window == 4096
    layers = BASE["num_hidden_layers"]
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    gemma2 = read_config({**BASE, "model_type": "gemma2", "sliding_window": 8, "layer_types": types})
    assert gemma2.sliding_windows == tuple(8 if i % 2 == 0 else None for i in range(layers))
    qwen3 = read_config({**BASE, "model_type": "qwen3", "sliding_window": 8, "use_sliding_window": True,
                                   "max_window_layers": 1})
    assert qwen3.sliding_windows == (None,) + (8,) * (layers - 1)


def test_architecture_name_is_enough():
    cfg = read_config({**BASE, "model_type": "my-llama", "architectures": ["LlamaForCausalLM"]})
    assert cfg.model_type == "my-llama"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "no-such-model"}, "transformers does not know it either"),
        ({"hidden_act": "relu2"}, "`hidden_act` 'relu2' is not supported"),
        ({"num_key_value_heads": 4}, "multiple"),
    ],
)
def test_rejects_other_architectures(change, message):
    with pytest.raises(ValueError, match=message):
        read_config({**BASE, **change})


def test_kv_cache_bytes_per_token_matches_allocation(tmp_path):
    small = {
        **BASE,
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(small))
    cfg = read_config_dir(tmp_path)
    for dtype in (torch.float32, torch.bfloat16):
        caches = allocate_kv_cache(cfg, num_blocks=3, block_size=8, dtype=dtype)
        allocated = sum(t.numel() * t.element_size() for pair in caches for t in pair)
        assert kv_cache_bytes_per_token(cfg, dtype) * 3 * 8 == allocated
        assert caches[0][0].shape == (3, 8, 2, 16)
    assert kv_cache_bytes_per_token(read_config(BASE), torch.float32) == 2 * 30 * 3 * 64 * 4


def test_gemma_configs_without_layer_types_alternate_as_transformers_fills_them():
    """Hub configs of Gemma 2 and 3 predate `layer_types`; transformers derives them from the pattern."""
    from transformers import AutoConfig

    for model_type, extra in (("gemma2", {}), ("gemma3_text", {"sliding_window_pattern": 3})):
        raw = {**BASE, "model_type": model_type, "num_hidden_layers": 7, "sliding_window": 8, "head_dim": 16, **extra}
        want = AutoConfig.for_model(**raw).layer_types
        got = read_config(raw).sliding_windows
        assert [w is not None for w in got] == [t == "sliding_attention" for t in want], model_type
