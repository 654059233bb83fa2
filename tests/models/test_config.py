"""ModelConfig parsing from config.json dicts (transformers 5 and older formats)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from tgi_llm.kv_cache import allocate_kv_cache
from tgi_llm.models.config import ModelConfig, kv_cache_bytes_per_token

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
    cfg = ModelConfig.from_dict(BASE)
    assert cfg.head_dim == 576 // 9
    assert cfg.num_queries_per_kv == 3
    assert cfg.rope.theta == 100000.0 and cfg.rope.rope_type == "default"
    assert cfg.tie_word_embeddings and not cfg.qkv_bias and not cfg.o_bias
    assert cfg.eos_token_ids == (2,)


def test_explicit_head_dim_and_missing_kv_heads():
    cfg = ModelConfig.from_dict({**BASE, "head_dim": 128, "num_key_value_heads": None})
    assert cfg.head_dim == 128 and cfg.num_key_value_heads == 9


def test_qwen2_has_qkv_bias_but_no_o_bias():
    cfg = ModelConfig.from_dict({**BASE, "model_type": "qwen2", "sliding_window": 4096})
    assert cfg.qkv_bias and not cfg.o_bias
    assert cfg.sliding_window is None  # use_sliding_window is false by default


def test_llama_attention_bias_covers_o_proj():
    cfg = ModelConfig.from_dict({**BASE, "attention_bias": True, "mlp_bias": True})
    assert cfg.qkv_bias and cfg.o_bias and cfg.mlp_bias


def test_sliding_window_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        cfg = ModelConfig.from_dict({**BASE, "model_type": "mistral", "sliding_window": 4096})
    assert cfg.sliding_window == 4096
    assert "sliding_window" in caplog.text


def test_architecture_name_is_enough():
    cfg = ModelConfig.from_dict({**BASE, "model_type": "my-llama", "architectures": ["LlamaForCausalLM"]})
    assert cfg.model_type == "my-llama"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "gpt2"}, "gpt2"),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"num_key_value_heads": 4}, "multiple"),
    ],
)
def test_rejects_other_architectures(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**BASE, **change})


def test_kv_cache_bytes_per_token_matches_allocation(tmp_path):
    small = {
        **BASE,
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(small))
    cfg = ModelConfig.from_model_dir(tmp_path)
    for dtype in (torch.float32, torch.bfloat16):
        caches = allocate_kv_cache(cfg, num_blocks=3, block_size=8, dtype=dtype)
        allocated = sum(t.numel() * t.element_size() for pair in caches for t in pair)
        assert kv_cache_bytes_per_token(cfg, dtype) * 3 * 8 == allocated
        assert caches[0][0].shape == (3, 8, 2, 16)
    assert kv_cache_bytes_per_token(ModelConfig.from_dict(BASE), torch.float32) == 2 * 30 * 3 * 64 * 4
