"""RoPE frequencies for every supported rope type against transformers' own init functions."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tgi_llm.models.layers.rotary import RopeConfig, RotaryEmbedding, apply_rotary

HEAD_DIM = 32

CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
        "rope_theta": 500000.0,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 1e4},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 256,
        "mscale": 0.7,
        "mscale_all_dim": 1.0,
        "rope_theta": 1e4,
    },
}


def hf_config(params: dict, max_pos: int = 1024) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=HEAD_DIM * 4,
        num_attention_heads=4,
        max_position_embeddings=max_pos,
        rope_parameters=dict(params),
    )


@pytest.mark.parametrize("case", list(CASES))
def test_inv_freq_and_scaling_match_transformers(case):
    params = CASES[case]
    hf = hf_config(params)
    init = ROPE_INIT_FUNCTIONS[params["rope_type"]] if params["rope_type"] != "default" else None
    if init is None:
        expected = 1.0 / (params["rope_theta"] ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        expected_scale = 1.0
    else:
        expected, expected_scale = init(hf, "cpu")
    ours = RotaryEmbedding(RopeConfig.from_hf(hf.to_dict()), HEAD_DIM, hf.max_position_embeddings)
    torch.testing.assert_close(ours.inv_freq, expected, rtol=1e-6, atol=0)
    assert ours.attention_scaling == pytest.approx(expected_scale)
    cos, sin = ours.cos_sin(torch.tensor([0, 3, 1000]))
    freqs = torch.tensor([0.0, 3.0, 1000.0])[:, None] * expected[None, :]
    torch.testing.assert_close(cos, freqs.cos() * expected_scale)
    torch.testing.assert_close(sin, freqs.sin() * expected_scale)


def test_dynamic_scales_each_sequence_by_its_own_length():
    params = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    hf = hf_config(params, max_pos=64)
    ours = RotaryEmbedding(RopeConfig.from_hf(hf.to_dict()), HEAD_DIM, 64)
    positions = torch.tensor([5, 5, 99])
    seq_lens = torch.tensor([10, 100, 100])  # same position, different sequence lengths
    cos, _ = ours.cos_sin(positions, seq_lens)
    short, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, "cpu", seq_len=10)
    long, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, "cpu", seq_len=100)
    torch.testing.assert_close(cos[0], (5 * short).cos())
    torch.testing.assert_close(cos[1], (5 * long).cos())
    torch.testing.assert_close(cos[2], (99 * long).cos())
    assert not torch.allclose(cos[0], cos[1])


def test_legacy_rope_scaling_format_is_read():
    legacy = {
        "rope_theta": 500000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "max_position_embeddings": 8,
    }
    rope = RopeConfig.from_hf(legacy)
    assert (rope.rope_type, rope.theta, rope.factor) == ("linear", 500000.0, 2.0)
    assert RopeConfig.from_hf({"rope_theta": 1e6}).rope_type == "default"


def test_unsupported_rope_type_is_rejected():
    with pytest.raises(ValueError, match="mrope"):
        RopeConfig.from_hf({"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e4}})


def test_apply_rotary_matches_rotate_half_form():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, HEAD_DIM, generator=gen)
    rope = RotaryEmbedding(RopeConfig(), HEAD_DIM, 128)
    cos, sin = rope.cos_sin(torch.arange(5))
    cos_full, sin_full = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
    rotated = torch.cat([-x[..., HEAD_DIM // 2 :], x[..., : HEAD_DIM // 2]], -1)
    torch.testing.assert_close(apply_rotary(x, cos, sin), x * cos_full + rotated * sin_full)
    # position 0 is the identity
    torch.testing.assert_close(apply_rotary(x, cos, sin)[0], x[0])
