"""GGUF -> HF directory conversion and its cache, on a tiny GGUF built from the default one's
tokenizer (first 2048 tokens) with random weights, some Q8_0-quantized."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import tgi_llm.weights.gguf as gguf_mod
import tgi_llm.weights.resolve as resolve_mod
from tgi_llm.models import load_model
from tgi_llm.quant.linear import QuantLinear
from tgi_llm.quant.modes import Quantization
from tgi_llm.weights import default_gguf_path, resolve_model_dir
from tgi_llm.weights.gguf_marker import MARKER_FILE

VOCAB = 2048


def write_mini_gguf(path: Path, hidden: int = 64, inter: int = 128, layers: int = 2, heads: int = 4,
                    fields: dict | None = None, tensors: dict[str, tuple[int, ...]] | None = None,
                    arch: str = "llama", head_dim: int | None = None) -> Path:
    """A small GGUF of llama.cpp's `arch` (llama, or qwen3 with its q/k norms) with the default model's
    tokenizer; `fields` adds metadata (name -> value), `tensors` adds float tensors (name -> shape)."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import quantize

    src = GGUFReader(default_gguf_path())
    tokens = [str(t) for t in src.fields["tokenizer.ggml.tokens"].contents()[:VOCAB]]
    kept = set(tokens)
    # a merge survives only if its parts and its result are still in the vocabulary
    merges = [
        m
        for m in src.fields["tokenizer.ggml.merges"].contents()
        if all(p in kept for p in m.split(" ")) and m.replace(" ", "") in kept
    ]
    head_dim = head_dim or hidden // heads
    overrides = {
        f"{arch}.block_count": layers,
        f"{arch}.embedding_length": hidden,
        f"{arch}.feed_forward_length": inter,
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": heads // 2,
        f"{arch}.rope.dimension_count": head_dim,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.context_length": 256,
        f"{arch}.vocab_size": VOCAB,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": src.fields["tokenizer.ggml.token_type"].contents()[:VOCAB],
    }
    writer = GGUFWriter(path, arch)
    for key, field in src.fields.items():
        if key.startswith("GGUF.") or key in ("general.file_type", "general.architecture"):
            continue
        key = f"{arch}.{key.removeprefix('llama.')}" if key.startswith("llama.") else key
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, overrides.pop(key, field.contents()), vtype, sub)
    for key in [k for k in overrides if k.startswith(f"{arch}.")]:  # what the source file does not have
        writer.add_uint32(key, overrides.pop(key))

    rng = np.random.default_rng(0)

    def add(name: str, *shape: int, q8: bool = False) -> None:
        if len(shape) == 1:
            data = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if q8:
            writer.add_tensor(name, quantize(data, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)

    for key, value in (fields or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_float32(key, value)
    kv = heads // 2
    for name, shape in (tensors or {}).items():
        add(name, *shape)
    add("token_embd.weight", VOCAB, hidden)  # no output.weight: tied embeddings, as in SmolLM2
    add("output_norm.weight", hidden)
    for i in range(layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", hidden)
        if arch == "qwen3":
            add(p + "attn_q_norm.weight", head_dim)
            add(p + "attn_k_norm.weight", head_dim)
        add(p + "ffn_norm.weight", hidden)
        add(p + "attn_q.weight", heads * head_dim, hidden)
        add(p + "attn_k.weight", kv * head_dim, hidden)
        add(p + "attn_v.weight", kv * head_dim, hidden)
        add(p + "attn_output.weight", hidden, heads * head_dim)
        add(p + "ffn_gate.weight", inter, hidden, q8=True)
        add(p + "ffn_up.weight", inter, hidden, q8=True)
        add(p + "ffn_down.weight", hidden, inter, q8=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def mini_gguf(tmp_path_factory) -> Path:
    return write_mini_gguf(tmp_path_factory.mktemp("gguf") / "mini.gguf")


@pytest.fixture(scope="module")
def converted(mini_gguf, tmp_path_factory) -> tuple[Path, Path]:
    cache = tmp_path_factory.mktemp("cache")
    return resolve_model_dir(str(mini_gguf), cache_dir=cache, progress=False), cache


def test_conversion_writes_a_plain_hf_directory(converted):
    model_dir, cache = converted
    assert model_dir.parent.parent == cache
    assert (model_dir / MARKER_FILE).is_file()
    config = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is True
    assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"]
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert not [p for p in cache.rglob(".tmp-*")]


def test_converted_dir_loads_with_transformers_and_matches_gguf(converted, mini_gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, _ = converted
    direct = AutoModelForCausalLM.from_pretrained(str(mini_gguf.parent), gguf_file=mini_gguf.name, dtype=torch.float32)
    loaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("Hello world, this is a test")["input_ids"]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.decode(ids) == "Hello world, this is a test"
    with torch.no_grad():
        expected = direct(torch.tensor([ids])).logits
        torch.testing.assert_close(loaded(torch.tensor([ids])).logits, expected)
    # and our own loader reads it: dequantized (tied lm_head), or its Q8_0 MLP as it is in the file
    ours, config = load_model(model_dir, quantization=Quantization("float"))
    assert ours.lm_head is ours.embed_tokens and config.vocab_size == VOCAB
    native, _ = load_model(model_dir)
    assert native.quantization.mode == "gguf"
    assert isinstance(native.layers[0].gate_up, QuantLinear) and native.layers[0].gate_up.qweight.source == "Q8_0"
    torch.testing.assert_close(native.layers[0].gate_up.dense_weight(), ours.layers[0].gate_up.dense_weight(),
                               rtol=0, atol=0)


def test_second_resolve_uses_the_cache(converted, mini_gguf, monkeypatch):
    model_dir, cache = converted
    mtime = (model_dir / "model.safetensors").stat().st_mtime_ns

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_mod, "convert_gguf", no_conversion)  # resolve imports it when it converts
    assert resolve_model_dir(str(mini_gguf), cache_dir=cache) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == mtime


def test_changed_gguf_gets_a_new_cache_entry(mini_gguf, tmp_path):
    copy = tmp_path / "mini.gguf"
    data = bytearray(mini_gguf.read_bytes())
    copy.write_bytes(data)
    first = resolve_mod.gguf_cache_dir(copy, tmp_path)
    data[-1] ^= 1  # same size, one bit of the last tensor changed
    copy.write_bytes(data)
    os.utime(copy, ns=(0, 10**9))
    assert resolve_mod.gguf_cache_dir(copy, tmp_path) != first


def test_the_same_gguf_reinstalled_reuses_its_conversion(mini_gguf, tmp_path, monkeypatch):
    """A new venv (another path) or a reinstall (another mtime) of the same file: no second copy."""
    first = resolve_mod.gguf_cache_dir(mini_gguf, tmp_path)
    elsewhere = tmp_path / "other-venv" / mini_gguf.name
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(mini_gguf.read_bytes())
    os.utime(elsewhere, ns=(0, 10**9))
    assert resolve_mod.gguf_cache_dir(elsewhere, tmp_path) == first

    def no_hashing(*_args, **_kwargs):
        raise AssertionError("hashed again")

    monkeypatch.setattr(resolve_mod.hashlib, "sha256", no_hashing)  # a known version is looked up, not hashed
    assert resolve_mod.gguf_cache_dir(elsewhere, tmp_path) == first
    (tmp_path / "gguf" / resolve_mod.CONTENT_INDEX).write_text("not json", encoding="utf-8")
    monkeypatch.undo()
    assert resolve_mod.gguf_cache_dir(elsewhere, tmp_path) == first  # a broken index: hashed again, same place


def test_an_unwritable_index_costs_a_hash_and_leaves_no_temp_file(mini_gguf, tmp_path, monkeypatch):
    def full_disk(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(resolve_mod.os, "replace", full_disk)
    first = resolve_mod.gguf_cache_dir(mini_gguf, tmp_path)
    assert list((tmp_path / "gguf").iterdir()) == []
    monkeypatch.undo()
    assert resolve_mod.gguf_cache_dir(mini_gguf, tmp_path) == first


def test_the_conversion_parses_the_gguf_header_once(mini_gguf, tmp_path, monkeypatch):
    """Config and weights come from one parse of the header (5.7 s on the default model's vocabulary; the
    tokenizer reads its own fields without one)."""
    import gguf

    opened = []
    original = gguf.GGUFReader

    def counting(path, *args, **kwargs):
        opened.append(path)
        return original(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    model_dir = resolve_model_dir(str(mini_gguf), cache_dir=tmp_path, progress=False)
    assert len(opened) == 1
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file()


def test_failed_conversion_leaves_nothing_behind(mini_gguf, tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(gguf_mod, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        resolve_model_dir(str(mini_gguf), cache_dir=tmp_path, progress=False)
    assert [p.name for p in (tmp_path / "gguf").iterdir()] == [resolve_mod.CONTENT_INDEX]  # no partial model


@pytest.mark.parametrize(("fields", "tensors", "match"), [
    ({}, {"blk.0.ffn_gate_shexp.weight": (128, 64)}, "tensor 'blk.0.ffn_gate_shexp.weight' is not part of"),
    ({}, {"blk.0.ffn_gate_exps.weight": (4, 128, 64)}, "llama.expert_count is missing"),
    ({"llama.expert_count": 4, "llama.expert_used_count": 2}, {}, "tensors missing: model.layers.0.block_sparse_moe"),
    ({}, {"blk.0.attn_output.bias": (64,)}, "tensors not used by the model: model.layers.0.self_attn.o_proj.bias"),
    ({"llama.rope.scaling.type": "su"}, {}, "rope scaling 'su' is not served"),
])
def test_a_gguf_with_what_we_do_not_read_is_refused_not_served(tmp_path, fields, tensors, match):
    """A loader that maps what it knows would drop these silently and serve a different model."""
    path = write_mini_gguf(tmp_path / "odd.gguf", fields=fields, tensors=tensors)
    with pytest.raises(ValueError, match=match):
        resolve_model_dir(str(path), cache_dir=tmp_path / "cache", progress=False)


def test_rope_scaling_the_loader_drops_reaches_the_model(tmp_path):
    """llama.cpp keeps Llama 3's scaling as per-frequency divisors (`rope_freqs`) and linear scaling as
    metadata: both reach the rotary embedding of the converted directory."""
    from gguf import GGUFReader

    head_dim = 16
    path = write_mini_gguf(tmp_path / "scaled.gguf", fields={"llama.rope.scaling.type": "linear",
                                                             "llama.rope.scaling.factor": 2.0})
    model, config = load_model(resolve_model_dir(str(path), cache_dir=tmp_path / "cache", progress=False))
    assert config.rope.rope_type == "linear" and config.rope.factor == 2.0
    base = 1.0 / (config.rope.theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    torch.testing.assert_close(model.rotary.inv_freq, base / 2.0)

    path = write_mini_gguf(tmp_path / "freqs.gguf", tensors={"rope_freqs.weight": (head_dim // 2,)})
    factors = next(np.asarray(t.data) for t in GGUFReader(path).tensors if t.name == "rope_freqs.weight")
    model, config = load_model(resolve_model_dir(str(path), cache_dir=tmp_path / "cache2", progress=False))
    assert config.rope.freq_factors == tuple(float(f) for f in factors)
    torch.testing.assert_close(model.rotary.inv_freq, base / torch.from_numpy(factors))


def test_a_qwen3_gguf_serves_what_transformers_reads_from_it(tmp_path, paged_batcher):
    """llama.cpp's qwen3 layout (q/k norms, unpermuted q/k rows, Q8_0 MLP blocks served as they are)."""
    from transformers import AutoModelForCausalLM

    from tests.models.parity import PagedRun, rel_err

    path = write_mini_gguf(tmp_path / "qwen3.gguf", arch="qwen3", heads=2, head_dim=128)  # transformers' head_dim
    model, config = load_model(resolve_model_dir(str(path), cache_dir=tmp_path / "cache", progress=False))
    assert config.family == "qwen3" and config.head_dim == 128 and model.layers[0].q_norm is not None
    assert isinstance(model.layers[0].down, QuantLinear)
    direct = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    prompt = list(range(5, 40))
    got = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=16)).step([(0, prompt)])[0]
    with torch.no_grad():
        want = direct(torch.tensor([prompt])).logits[0]
    assert rel_err(got, want) < 1e-4


@pytest.mark.slow
def test_default_model_directory(default_model_dir):
    from transformers import AutoTokenizer

    config = json.loads((default_model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    generation = json.loads((default_model_dir / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["bos_token_id"]) == (2, 1)
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    assert tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert "<|im_start|>" in json.loads((default_model_dir / "tokenizer_config.json").read_text())["chat_template"]
    assert resolve_model_dir(None) == default_model_dir  # cached
