"""GGUFs of every native family as users make them: llama.cpp's own convert_hf_to_gguf.py run on a random tiny
checkpoint (scripts/setup.sh fetches it), then served by us. Float files must give the original checkpoint's
logits under transformers; quantized ones, their blocks served through the quantized kernels, what their
dequantized values give."""

from __future__ import annotations

import io
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import TOKENIZER_FILES
from tests.models.parity import (
    PagedRun,
    assert_schedule_matches,
    random_prompts,
    reference_logits,
    reference_model,
    rel_err,
)
from tgi_llm.models import load_model
from tgi_llm.quant.linear import QuantLinear
from tgi_llm.quant.modes import Quantization
from tgi_llm.weights import resolve_model_dir

CONVERTER = Path(__file__).resolve().parents[2] / ".venv" / "llama.cpp" / "convert_hf_to_gguf.py"
_HEADS = {"head_dim": 16}
#: llama.cpp fixes what these files do not store: Gemma's query scale is the head size, Gemma 3 has one
#: global layer in six, SmolLM3 no rope in every fourth (gguf_config.py); the checkpoints follow it.
_GEMMA = {**_HEADS, "query_pre_attn_scalar": 16, "sliding_window": 6, "num_hidden_layers": 7}

#: name -> (model_type, config overrides, tokenizer, the family that must serve it). "spm": a small trained
#: sentencepiece model; "bpe": the default model's tokenizer (llama.cpp's converter knows its pre-tokenizer),
#: for the architectures whose converter reads only byte-level BPE.
FAMILIES = {
    "llama3": ("llama", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                             "rope_theta": 1e4}}, "spm", "llama"),
    "mistral": ("mistral", {"sliding_window": None}, "spm", "llama"),
    "qwen2": ("qwen2", {}, "spm", "qwen2"),
    "qwen3": ("qwen3", _HEADS, "spm", "qwen3"),
    "gemma": ("gemma", {**_HEADS, "tie_word_embeddings": True}, "spm", "gemma"),
    "gemma2": ("gemma2", {**_GEMMA, "tie_word_embeddings": True, "attn_logit_softcapping": 3.0,
                          "final_logit_softcapping": 5.0}, "spm", "gemma2"),
    "gemma3": ("gemma3_text", {**_GEMMA, "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}}, "spm", "gemma3"),
    "phi3": ("phi3", {"sliding_window": 9, "pad_token_id": 0}, "spm", "phi3"),
    "phi4-mini": ("phi3", {"partial_rotary_factor": 0.5, "pad_token_id": 0}, "spm", "phi3"),
    "granite": ("granite", {"embedding_multiplier": 3.0, "residual_multiplier": 0.4, "attention_multiplier": 0.2,
                            "logits_scaling": 2.5}, "spm", "granite"),
    "olmo2": ("olmo2", {}, "bpe", "olmo2"),
    "smollm3": ("smollm3", {"num_hidden_layers": 4, "pad_token_id": 0}, "spm", "smollm3"),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}, "spm",
                "mixtral"),
    "qwen3-moe": ("qwen3_moe", {**_HEADS, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                                "norm_topk_prob": True}, "bpe", "qwen3_moe"),
}
_SPM_VOCAB = 384


@pytest.fixture(scope="session")
def sentencepiece_model() -> bytes:
    import sentencepiece as spm

    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog while servers batch paged attention on cpus".split()
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=320,
                                   model_type="bpe", byte_fallback=True, minloglevel=2)
    return out.getvalue()


@pytest.fixture(scope="session")
def family_checkpoint(tiny_model_factory, default_model_dir, sentencepiece_model, tmp_path_factory):
    """name -> a tiny checkpoint of that family with a tokenizer llama.cpp's converter reads."""
    built: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in built:
            model_type, overrides, tokenizer, _ = FAMILIES[name]
            vocab = _SPM_VOCAB if tokenizer == "spm" else 49152
            path = tmp_path_factory.mktemp(f"ckpt-{name}") / name
            shutil.copytree(tiny_model_factory(model_type, vocab_size=vocab, **overrides), path)
            if tokenizer == "spm":
                (path / "tokenizer.model").write_bytes(sentencepiece_model)
            else:
                for file in TOKENIZER_FILES:
                    if (default_model_dir / file).is_file():
                        shutil.copy(default_model_dir / file, path / file)
            built[name] = path
        return built[name]

    return make


def llama_cpp_convert(checkpoint: Path, out: Path, outtype: str) -> Path:
    if not CONVERTER.is_file():
        pytest.fail(f"{CONVERTER} is missing: run scripts/setup.sh")
    done = subprocess.run([sys.executable, str(CONVERTER), str(checkpoint), "--outtype", outtype,
                           "--outfile", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def requantize(src: Path, dst: Path, kind: str) -> Path:
    """`src` with every float matrix of rows a multiple of 32 stored as GGML type `kind` (gguf-py's numpy
    quantizer: llama.cpp's converter writes no 4-bit types itself)."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import quantize

    reader = GGUFReader(src)
    writer = GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub)
    qtype = GGMLQuantizationType[kind]
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.tensor_type.name == "F32" and data.ndim >= 2 and data.shape[-1] % 32 == 0:
            writer.add_tensor(t.name, quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def _served(gguf_path: Path, tmp_path: Path):
    model_dir = resolve_model_dir(str(gguf_path), cache_dir=tmp_path / "cache", progress=False)
    model, config = load_model(model_dir)
    return model_dir, model, config


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_float_gguf_serves_the_original_checkpoint(family_checkpoint, paged_batcher, tmp_path, name):
    """F32 from llama.cpp's converter: what llama.cpp stores and what it fixes per architecture come back as
    the original config and weights. Prompts in one batch, then chunks and decodes past the windows."""
    checkpoint = family_checkpoint(name)
    _, model, config = _served(llama_cpp_convert(checkpoint, tmp_path / f"{name}.gguf", "f32"), tmp_path)
    assert config.family == FAMILIES[name][3]
    ref = reference_model(checkpoint)
    prompts = random_prompts([1, 5, 13, 30], min(config.vocab_size, 300))
    got = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=40)).step(list(enumerate(prompts)))
    for prompt, logits in zip(prompts, got, strict=True):
        assert rel_err(logits, reference_logits(ref, prompt)) < 1e-4
    full = random_prompts([22, 14], min(config.vocab_size, 300), seed=1)
    schedule = [[(0, 9), (1, 6)], [(0, 1), (1, 5)], [(0, 7), (1, 1)], [(0, 1), (1, 1)], [(0, 4), (1, 1)]]
    run = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=40, seed=1))
    assert_schedule_matches(run, ref, full, schedule)


#: Q8_0 as llama.cpp's converter writes it for every family; Q4_0/Q4_1 where layouts differ most (fused
#: Phi-3 projections, stacked experts, Gemma's norms, permuted Llama rows).
_QUANTIZED = [(name, "Q8_0") for name in FAMILIES] + [
    ("phi3", "Q4_0"), ("mixtral", "Q4_0"), ("qwen3-moe", "Q4_1"), ("gemma2", "Q4_1"), ("llama3", "Q4_1")]


@pytest.mark.parametrize(("name", "kind"), _QUANTIZED)
def test_a_quantized_gguf_serves_its_blocks(family_checkpoint, paged_batcher, tmp_path, name, kind):
    checkpoint = family_checkpoint(name)
    if kind == "Q8_0":
        path = llama_cpp_convert(checkpoint, tmp_path / f"{name}.gguf", "q8_0")
    else:
        path = requantize(llama_cpp_convert(checkpoint, tmp_path / "f32.gguf", "f32"), tmp_path / f"{name}.gguf",
                          kind)
    model_dir, model, config = _served(path, tmp_path)
    assert config.family == FAMILIES[name][3]
    quantized = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert quantized and {m.qweight.source for m in quantized} == {kind}
    floats, _ = load_model(model_dir, quantization=Quantization("float"))  # the dequantized values
    prompts = list(enumerate(random_prompts([3, 17], min(config.vocab_size, 300))))
    got = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=40)).step(prompts)
    want = PagedRun(floats, config, paged_batcher(block_size=4, num_blocks=40)).step(prompts)
    for logits, expected in zip(got, want, strict=True):
        assert rel_err(logits, expected) < 1e-4


def test_what_llama_cpp_fixes_is_written_back(family_checkpoint, tmp_path):
    """The converted config says what llama.cpp runs: Gemma 3's one global layer in six and its local rope
    base, SmolLM3's rope-less fourth layers, a Mixtral (llama.cpp's `llama` plus experts) as a Mixtral."""
    import json

    def converted(name: str) -> dict:
        path = llama_cpp_convert(family_checkpoint(name), tmp_path / f"{name}.gguf", "f32")
        model_dir = resolve_model_dir(str(path), cache_dir=tmp_path / "cache", progress=False)
        return json.loads((model_dir / "config.json").read_text())

    gemma3 = converted("gemma3")
    assert gemma3["layer_types"] == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]
    assert gemma3["rope_parameters"]["sliding_attention"]["rope_theta"] == 100.0
    assert converted("smollm3")["no_rope_layers"] == [1, 1, 1, 0]
    mixtral = converted("mixtral")
    assert mixtral["model_type"] == "mixtral" and mixtral["num_local_experts"] == 4
    assert torch.equal(torch.tensor(converted("granite")["logits_scaling"]), torch.tensor(2.5))
