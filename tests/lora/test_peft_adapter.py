"""Reading PEFT adapters: every part lands scaled in its place, what cannot run is refused by name, and a
tensor-parallel shard takes its slice of A or B as the base layer is split."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tgi_llm.lora.peft_adapter import AdapterError, read_adapter
from tgi_llm.models.registry import read_config_dir
from tgi_llm.weights.safetensors_loader import Shard

from .peft_adapters import make_adapter


@pytest.fixture(scope="module")
def base(tiny_model_factory):
    return tiny_model_factory("llama")


def _config(base_dir):
    return read_config_dir(base_dir)


def test_every_part_is_scaled_and_placed(base, tmp_path):
    path = make_adapter(base, tmp_path / "a", 1, r=4, lora_alpha=12)
    parts = read_adapter(path, _config(base), max_rank=16)
    raw = load_file(str(path / "adapter_model.safetensors"))
    assert len(parts) == 2 * 7  # 2 layers x q, k, v, o, gate, up, down
    q = next(p for p in parts if p.layer == 1 and p.linear == "qkv" and p.part == 0)
    b = raw["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"]
    torch.testing.assert_close(q.b, b * 12 / 4)
    assert {(p.linear, p.part) for p in parts if p.layer == 0} == {
        ("qkv", 0), ("qkv", 1), ("qkv", 2), ("o_proj", 0), ("gate_up", 0), ("gate_up", 1), ("down", 0)}


def test_rslora_scales_by_the_root_of_the_rank(base, tmp_path):
    path = make_adapter(base, tmp_path / "a", 2, r=4, targets=("v_proj",), lora_alpha=8, use_rslora=True)
    (part, *_) = read_adapter(path, _config(base), max_rank=16)
    raw = load_file(str(path / "adapter_model.safetensors"))
    torch.testing.assert_close(part.b, raw["base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"] * 4)


@pytest.mark.parametrize("config, words", [
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"bias": "lora_only"}, "bias"),
])
def test_unsupported_kinds_are_refused_by_name(base, tmp_path, config, words):
    path = make_adapter(base, tmp_path / "a", 3, r=4, targets=("q_proj",), **config)
    with pytest.raises(AdapterError, match=words):
        read_adapter(path, _config(base), max_rank=16)


def test_embedding_adapters_are_refused(base, tmp_path):
    path = make_adapter(base, tmp_path / "a", 3, r=4, targets=("embed_tokens",))
    with pytest.raises(AdapterError, match="embeddings or the LM head"):
        read_adapter(path, _config(base), max_rank=16)


def test_a_rank_over_the_limit_names_the_limit(base, tmp_path):
    path = make_adapter(base, tmp_path / "a", 4, r=32, targets=("o_proj",))
    with pytest.raises(AdapterError, match="rank 32 is over the server's `max_lora_rank` 16"):
        read_adapter(path, _config(base), max_rank=16)


def test_an_adapter_of_another_base_model_is_refused(base, tiny_model_factory, tmp_path):
    other = tiny_model_factory("llama", hidden_size=32, intermediate_size=64)
    path = make_adapter(other, tmp_path / "a", 5, r=4)
    with pytest.raises(AdapterError, match="another base model"):
        read_adapter(path, _config(base), max_rank=16)


def test_missing_files_are_named(base, tmp_path):
    with pytest.raises(AdapterError, match="no such directory"):
        read_adapter(tmp_path / "nowhere", _config(base), max_rank=16)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    (tmp_path / "bin" / "adapter_model.bin").write_bytes(b"")
    with pytest.raises(AdapterError, match="convert it to safetensors"):
        read_adapter(tmp_path / "bin", _config(base), max_rank=16)


def test_shards_split_b_of_column_and_a_of_row_parallel_linears(base, tmp_path):
    path = make_adapter(base, tmp_path / "a", 6, r=4, targets=("q_proj", "down_proj"))
    whole = {(p.layer, p.linear): p for p in read_adapter(path, _config(base), 16)}
    for rank in range(2):
        for part in read_adapter(path, _config(base), 16, Shard(rank, 2)):
            full = whole[(part.layer, part.linear)]
            if part.linear == "qkv":  # column-parallel: output rows
                torch.testing.assert_close(part.a, full.a)
                torch.testing.assert_close(part.b, full.b.chunk(2, dim=0)[rank])
            else:  # row-parallel: input columns
                torch.testing.assert_close(part.a, full.a.chunk(2, dim=1)[rank])
                torch.testing.assert_close(part.b, full.b)
