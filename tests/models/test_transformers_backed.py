"""Models no native family serves, through transformers' own modeling code with our paged attention: the
same parity with transformers as the native families, and clear refusals for what it cannot serve."""

from __future__ import annotations

import json

import pytest
import torch

from tests.models.parity import (
    PagedRun,
    assert_greedy_is_transformers_choice,
    assert_schedule_matches,
    random_prompts,
    reference_model,
)
from tgi_llm.models import load_model
from tgi_llm.models.backed_config import FAMILY
from tgi_llm.models.transformers_backed import TransformersCausalLM

torch.set_num_threads(2)

#: model_type -> config overrides: architectures with parts no native family has (LayerNorm with biases,
#: GELU MLPs without a gate, partial rotary, parallel attention and MLP, logit scales, sliding windows).
BACKED = {
    "starcoder2": {"sliding_window": 6, "use_bias": True},
    "stablelm": {"partial_rotary_factor": 0.5, "use_qkv_bias": True},
    "cohere": {"logit_scale": 0.5, "pad_token_id": 0},
    "gpt_neox": {"rotary_pct": 0.5, "use_parallel_residual": True, "num_key_value_heads": 4},  # MHA
}


def _backed(tiny_model_factory, model_type: str):
    model_dir = tiny_model_factory(model_type, **BACKED[model_type])
    model, config = load_model(model_dir)
    assert config.family == FAMILY and isinstance(model, TransformersCausalLM)
    return model_dir, model, config


@pytest.mark.parametrize("model_type", list(BACKED))
def test_chunks_and_decodes_match_transformers(tiny_model_factory, paged_batcher, model_type):
    model_dir, model, config = _backed(tiny_model_factory, model_type)
    ref = reference_model(model_dir)
    full = random_prompts([22, 14, 5], config.vocab_size, seed=1)
    schedule = [[(0, 9), (1, 6), (2, 5)], [(0, 1), (1, 5), (2, 1)], [(0, 7), (1, 1)], [(0, 5), (1, 2)]]
    run = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=40))
    assert_schedule_matches(run, ref, full, schedule)


def test_served_greedy_tokens_are_transformers_own_choice(tiny_model_factory, default_model_dir, tmp_path):
    import shutil

    from tests.conftest import TOKENIZER_FILES
    from tgi_llm import LLM

    model_dir = tmp_path / "starcoder2"
    shutil.copytree(tiny_model_factory("starcoder2", vocab_size=49152, **BACKED["starcoder2"]), model_dir)
    for file in TOKENIZER_FILES:
        if (default_model_dir / file).is_file():
            shutil.copy(default_model_dir / file, model_dir / file)
    prompts = random_prompts([19, 7, 26], 49152, seed=4)
    params = {"max_new_tokens": 8, "ignore_eos": True}
    with LLM(str(model_dir), kv_cache_memory_gb=0.05, block_size=4, max_batch_prefill_tokens=8) as llm:
        outputs = [r.token_ids for r in llm.generate(prompts, params)]
        again = [r.token_ids for r in llm.generate(prompts, params)]  # through the prefix cache
        stats = llm.engine.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total
    assert again == outputs
    assert_greedy_is_transformers_choice(reference_model(model_dir), prompts, outputs)


@pytest.mark.parametrize(("cfg", "match"), [
    ({"model_type": "t5", "vocab_size": 64, "d_model": 32}, "encoder-decoder"),
    ({"model_type": "mamba", "vocab_size": 64, "hidden_size": 32}, "no attention layers"),
    ({"model_type": "no-such-model", "vocab_size": 64}, "transformers does not know it either"),
    ({"model_type": "llama4"}, "it takes multimodal inputs"),
])
def test_what_transformers_cannot_serve_here_is_refused_at_start_up(tmp_path, cfg, match):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
        load_model(tmp_path)


def test_quantizing_or_sharding_a_backed_model_is_refused(tiny_model_factory):
    from tgi_llm.quant.modes import Quantization

    with pytest.raises(ValueError, match="float weights on one shard only"):
        load_model(tiny_model_factory("starcoder2", **BACKED["starcoder2"]), quantization=Quantization("int8"))
