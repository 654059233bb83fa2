"""--rope-scaling / --rope-factor: the pair as TGI makes it, the config it leaves, the frequencies it gives."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tgi_llm.engine.options import EngineOptions
from tgi_llm.models.layers.rotary import RotaryEmbedding
from tgi_llm.models.loader import load_model
from tgi_llm.models.registry import read_config
from tgi_llm.models.rope_override import RopeOverride
from tgi_llm.weights.gguf_config import FREQ_FACTORS_KEY

HEAD_DIM = 32
CONFIG = {
    "model_type": "llama", "hidden_size": HEAD_DIM * 4, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


def hf_config(rope: dict) -> LlamaConfig:
    return LlamaConfig(hidden_size=HEAD_DIM * 4, num_attention_heads=4, max_position_embeddings=256,
                       rope_parameters={"rope_theta": 10000.0, **rope})


def test_the_options_check_the_pair_naming_the_flag():
    assert EngineOptions(rope_factor=4.0).rope_override == RopeOverride("linear", 4.0)
    assert EngineOptions().rope_override is None
    with pytest.raises(ValueError, match=r"`--rope-scaling` must be one of linear, dynamic\. Given: yarn"):
        EngineOptions(rope_scaling="yarn", rope_factor=4.0)
    with pytest.raises(ValueError, match=r"`--rope-factor` must be > 0\. Given: 0"):
        EngineOptions(rope_scaling="dynamic", rope_factor=0)


def test_it_replaces_the_config_s_own_scaling_and_keeps_its_base_and_context(caplog):
    yarn = read_config({**CONFIG, "max_position_embeddings": 8192, "partial_rotary_factor": 0.5, "rope_parameters": {
        "rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}})
    with caplog.at_level(logging.WARNING):
        config = RopeOverride("dynamic", 2.0).apply(yarn)
    assert "replaces the rope scaling of the model's config (yarn)" in caplog.text
    assert (config.rope.rope_type, config.rope.factor, config.rope.theta) == ("dynamic", 2.0, 1e6)
    assert config.rope.partial_factor == 0.5 and config.max_position_embeddings == 8192
    assert RopeOverride("dynamic", 2.0).context(config.max_position_embeddings) == 16384
    gguf = read_config({**CONFIG, FREQ_FACTORS_KEY: [1.0] * (HEAD_DIM // 2)})  # llama3 scaling from a GGUF
    assert RopeOverride("linear", 4.0).apply(gguf).rope.freq_factors == ()


def test_a_linear_factor_divides_every_frequency_as_transformers_does():
    config = RopeOverride("linear", 4.0).apply(read_config(CONFIG))
    ours = RotaryEmbedding(config.rope, HEAD_DIM, config.max_position_embeddings)
    plain = RotaryEmbedding(read_config(CONFIG).rope, HEAD_DIM, 256)
    torch.testing.assert_close(ours.inv_freq, plain.inv_freq / 4, rtol=1e-6, atol=0)
    expected, _ = ROPE_INIT_FUNCTIONS["linear"](hf_config({"rope_type": "linear", "factor": 4.0}), "cpu")
    torch.testing.assert_close(ours.inv_freq, expected, rtol=1e-6, atol=0)


def test_dynamic_keeps_the_trained_frequencies_within_the_context_and_grows_the_base_past_it():
    config = RopeOverride("dynamic", 4.0).apply(read_config(CONFIG))
    ours = RotaryEmbedding(config.rope, HEAD_DIM, config.max_position_embeddings)
    plain = RotaryEmbedding(read_config(CONFIG).rope, HEAD_DIM, 256)
    positions, seq_lens = torch.tensor([100, 100, 899]), torch.tensor([200, 900, 900])
    cos, _ = ours.cos_sin(positions, seq_lens)
    torch.testing.assert_close(cos[0], plain.cos_sin(positions[:1])[0][0])  # a 200-token sequence: as trained
    grown, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf_config({"rope_type": "dynamic", "factor": 4.0}), "cpu", seq_len=900)
    torch.testing.assert_close(cos[1], (100 * grown).cos())
    torch.testing.assert_close(cos[2], (899 * grown).cos())


def test_the_loaded_model_rotates_with_the_override(tiny_model_factory):
    model_dir = tiny_model_factory(max_position_embeddings=256)
    plain, _ = load_model(model_dir)
    model, config = load_model(model_dir, rope_override=RopeOverride("linear", 4.0))
    assert (config.rope.rope_type, config.rope.factor, config.max_position_embeddings) == ("linear", 4.0, 256)
    torch.testing.assert_close(model.rotary.inv_freq, plain.rotary.inv_freq / 4, rtol=1e-6, atol=0)


def test_a_model_served_by_transformers_code_refuses_it(tiny_model_factory):
    with pytest.raises(ValueError, match="no --rope-scaling / --rope-factor"):
        load_model(tiny_model_factory("starcoder2"), rope_override=RopeOverride("dynamic", 2.0))
