"""Every native family against transformers' eager forward on the same random tiny checkpoint: prompts in one
mixed batch, then prompt chunks and decodes over several steps, with prompts longer than the sliding windows."""

from __future__ import annotations

import pytest
import torch

from tests.models.parity import (
    PagedRun,
    assert_greedy_is_transformers_choice,
    assert_schedule_matches,
    random_prompts,
    reference_logits,
    reference_model,
    rel_err,
)
from tgi_llm.models import load_model

torch.set_num_threads(2)

_SMALL_HEADS = {"head_dim": 16}
_GEMMA = {**_SMALL_HEADS, "query_pre_attn_scalar": 24, "sliding_window": 6, "num_hidden_layers": 4}

#: name -> (model_type, config overrides, the family that must serve it)
FAMILIES = {
    "mistral-window": ("mistral", {"sliding_window": 6, "num_hidden_layers": 3}, "mistral"),
    "qwen2-window-from-layer-1": ("qwen2", {"use_sliding_window": True, "sliding_window": 5,
                                            "max_window_layers": 1, "num_hidden_layers": 3}, "qwen2"),
    "qwen3": ("qwen3", _SMALL_HEADS, "qwen3"),
    "qwen3-window": ("qwen3", {**_SMALL_HEADS, "use_sliding_window": True, "sliding_window": 7,
                               "max_window_layers": 0}, "qwen3"),
    "gemma": ("gemma", _SMALL_HEADS, "gemma"),
    "gemma2": ("gemma2", {**_GEMMA, "attn_logit_softcapping": 3.0, "final_logit_softcapping": 5.0}, "gemma2"),
    "gemma3": ("gemma3_text", {**_GEMMA, "layer_types": ["sliding_attention", "full_attention"] * 2,
                               "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                                   "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                      "rope_theta": 10000.0}}}, "gemma3"),
    "phi3": ("phi3", {"sliding_window": 9, "pad_token_id": 0}, "phi3"),
    "phi3-partial-rotary": ("phi3", {"partial_rotary_factor": 0.5, "pad_token_id": 0}, "phi3"),
    "phi3-longrope": ("phi3", {"max_position_embeddings": 64, "original_max_position_embeddings": 16,
                               "pad_token_id": 0,
                               "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                   "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
                                                   "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]}},
                      "phi3"),
    "granite": ("granite", {"embedding_multiplier": 3.0, "residual_multiplier": 0.4, "attention_multiplier": 0.2,
                            "logits_scaling": 2.5}, "granite"),
    "olmo2": ("olmo2", {}, "olmo2"),
    "smollm3": ("smollm3", {"num_hidden_layers": 4, "no_rope_layer_interval": 2, "pad_token_id": 0}, "smollm3"),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}, "mixtral"),
    "qwen3-moe": ("qwen3_moe", {**_SMALL_HEADS, "num_experts": 4, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 48, "num_hidden_layers": 3, "mlp_only_layers": [1],
                                "norm_topk_prob": True}, "qwen3_moe"),
}


#: Other shapes of the same families: head sizes, GQA ratios (MHA, 8:1), windows, rope scalings, experts.
SHAPES = {
    "qwen3-gqa-8-1-head-32": ("qwen3", {"head_dim": 32, "num_attention_heads": 8, "num_key_value_heads": 1,
                                         "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                             "original_max_position_embeddings": 16}}, "qwen3"),
    "gemma2-8-heads-of-4": ("gemma2", {**_GEMMA, "head_dim": 32, "num_attention_heads": 8, "num_key_value_heads": 4,
                                       "sliding_window": 11}, "gemma2"),
    "olmo2-mha-head-8": ("olmo2", {"num_attention_heads": 8, "num_key_value_heads": 8}, "olmo2"),
    "mixtral-8-experts-top-3": ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 3, "sliding_window": None,
                                            "num_key_value_heads": 1}, "mixtral"),
    "smollm3-llama3-rope": ("smollm3", {"pad_token_id": 0, "rope_parameters": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16, "rope_theta": 1e4}}, "smollm3"),
    "granite-gqa-4-1": ("granite", {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16,
                                    "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                                    "attention_multiplier": 0.0625, "logits_scaling": 8.0}, "granite"),
}


def _family_model(tiny_model_factory, name: str):
    model_type, overrides, family = {**FAMILIES, **SHAPES}[name]
    model_dir = tiny_model_factory(model_type, **overrides)
    model, config = load_model(model_dir)
    assert config.family == family
    return model_dir, model, config


@pytest.mark.parametrize("name", [*FAMILIES, *SHAPES])
def test_prompts_in_one_batch_match_transformers(tiny_model_factory, paged_batcher, name):
    model_dir, model, config = _family_model(tiny_model_factory, name)
    ref = reference_model(model_dir)
    prompts = random_prompts([1, 5, 13, 30], config.vocab_size)
    got = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=40)).step(list(enumerate(prompts)))
    for prompt, logits in zip(prompts, got, strict=True):
        assert rel_err(logits, reference_logits(ref, prompt)) < 1e-4


#: longrope switches factors once a sequence outgrows the original context: keys computed before keep the
#: short ones, in transformers' own cache too, so a whole-sequence forward is not the reference there.
_INCREMENTAL = [name for name in [*FAMILIES, *SHAPES] if name != "phi3-longrope"]


@pytest.mark.parametrize("name", _INCREMENTAL)
def test_chunks_and_decodes_match_the_whole_sequence(tiny_model_factory, paged_batcher, name):
    """Windows slide past block boundaries while other sequences decode in the same steps."""
    model_dir, model, config = _family_model(tiny_model_factory, name)
    ref = reference_model(model_dir)
    full = random_prompts([22, 14], config.vocab_size, seed=1)
    schedule = [[(0, 9), (1, 6)], [(0, 1), (1, 5)], [(0, 7), (1, 1)], [(0, 1), (1, 1)], [(0, 4), (1, 1)]]
    run = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=40))
    assert_schedule_matches(run, ref, full, schedule)


def test_what_the_c_layer_stack_does_not_implement_keeps_the_torch_layers(tiny_model_factory):
    from tgi_llm.models.layer_stack import _why_not

    model, config = load_model(tiny_model_factory("gemma", hidden_activation="gelu", **_SMALL_HEADS))
    assert config.layer_stack_refusal == "the gelu activation"  # exact (erf) GELU: the stack has tanh's
    assert "the gelu activation" in _why_not(model, [])
    for name in ("qwen3", "gemma2", "gemma3", "olmo2", "granite", "smollm3", "phi3", "phi3-partial-rotary",
                 "mixtral", "qwen3-moe"):
        assert _family_model(tiny_model_factory, name)[1].config.layer_stack_refusal is None


@pytest.mark.parametrize("name", ["qwen3", "gemma", "gemma2", "gemma3", "olmo2", "granite", "smollm3", "mixtral",
                                  "qwen3-moe", "mixtral-8-experts-top-3", "phi3-partial-rotary"])
def test_the_c_layer_stack_runs_each_family_it_implements(tiny_model_factory, paged_batcher, c_kernels, name):
    """Prompt steps and decode steps through the stack, checked on the live model against the torch layers
    (and here against transformers): q/k norms, norms after blocks, residual scales, layers without rope,
    local rope tables, the tanh-GELU gate, soft-capped decode scores (Gemma 2's prompts: the torch layers),
    experts (Qwen3-MoE with a dense layer among them), rope on half of each head (Phi-4-mini)."""
    model_dir, model, config = _family_model(tiny_model_factory, name)
    ref = reference_model(model_dir)
    tokens = random_prompts([6], config.vocab_size, seed=5)[0]
    run = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=16))
    got = run.step([(0, tokens[:3])]) + run.step([(0, tokens[3:4])]) + run.step([(0, tokens[4:5])])
    got += run.step([(0, tokens[5:])])
    stack = model._layer_stack(run.caches)
    assert stack is not None and "decode" in stack.checked and stack.agrees
    assert rel_err(torch.cat(got), reference_logits(ref, tokens)) < 1e-4


def test_a_sliding_window_model_runs_the_c_layer_stack_until_a_sequence_outgrows_the_window(
        tiny_model_factory, paged_batcher, c_kernels):
    model_dir, model, config = _family_model(tiny_model_factory, "mistral-window")
    ref = reference_model(model_dir)
    tokens = random_prompts([9], config.vocab_size, seed=5)[0]
    run = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=16))
    got = run.step([(0, tokens[:5])]) + run.step([(0, tokens[5:6])])  # 6 tokens: inside the window
    stack = model._layer_stack(run.caches)
    assert stack is not None and stack.window == 6
    assert "decode" in stack.checked and stack.agrees  # (prompt steps too where its prefill kernel wins)
    got += run.step([(0, tokens[6:7])]) + run.step([(0, tokens[7:])])  # past it: the torch layers
    assert rel_err(torch.cat(got), reference_logits(ref, tokens)) < 1e-4


@pytest.mark.parametrize(("cfg", "match"), [
    ({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}, "model_type 'mamba'"),
    ({"model_type": "llama", "hidden_act": "relu2"}, "`hidden_act` 'relu2' is not supported"),
])
def test_what_no_family_serves_is_refused_at_load(tmp_path, cfg, match):
    import json

    base = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps({**base, **cfg}))
    with pytest.raises(ValueError, match=match):
        load_model(tmp_path)


#: Families served end to end (with the default model's tokenizer, so the vocabulary is its 49,152).
_SERVED = ["mistral-window", "qwen3", "gemma2", "gemma3", "phi3", "granite", "olmo2", "smollm3", "mixtral",
           "qwen3-moe"]


@pytest.mark.parametrize("name", _SERVED)
def test_served_greedy_tokens_are_transformers_own_choice(tiny_model_factory, default_model_dir, tmp_path, name):
    """Through the engine: prompts longer than the windows, together, again through the prefix cache, and in
    prompt chunks of 8 tokens; every generated token is transformers' top choice on the same weights, or
    within a near-tie of it (random weights)."""
    import shutil

    from tests.conftest import TOKENIZER_FILES
    from tgi_llm import LLM

    model_type, overrides, _ = FAMILIES[name]
    model_dir = tmp_path / name
    shutil.copytree(tiny_model_factory(model_type, vocab_size=49152, **overrides), model_dir)
    for file in TOKENIZER_FILES:
        if (default_model_dir / file).is_file():
            shutil.copy(default_model_dir / file, model_dir / file)
    prompts = random_prompts([19, 7, 26], 49152, seed=4)
    params = {"max_new_tokens": 10, "ignore_eos": True}
    runs = {}
    for label, options in {"whole": {}, "chunks of 8": {"max_batch_prefill_tokens": 8}}.items():
        with LLM(str(model_dir), kv_cache_memory_gb=0.05, block_size=4, **options) as llm:
            runs[label] = [r.token_ids for r in llm.generate(prompts, params)]
            runs[label + ", cached"] = [r.token_ids for r in llm.generate(prompts, params)]
            stats = llm.engine.stats()
        assert stats.kv_blocks_free == stats.kv_blocks_total
    ref = reference_model(model_dir)
    for outputs in runs.values():
        assert all(len(out) == params["max_new_tokens"] for out in outputs)
        assert_greedy_is_transformers_choice(ref, prompts, outputs)


def test_a_gemma3_multimodal_checkpoint_serves_its_language_model(tmp_path, paged_batcher):
    """Gemma 3 from 4B up ships as Gemma3ForConditionalGeneration: its text model is served natively (weights
    under `language_model.model.`), with transformers' defaults for what the Hub's text_config leaves out;
    text-only logits are the multimodal model's own."""
    import json

    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 7, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 384, "sliding_window": 6,
            "query_pre_attn_scalar": 16}
    torch.manual_seed(0)
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 28, "patch_size": 14}
    Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                                image_token_index=300, boi_token_index=301, eoi_token_index=302)
                                   ).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["text_config"] = {**text, "model_type": "gemma3_text"}  # as the Hub writes it: what differs only
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model, config = load_model(tmp_path)
    assert config.family == "gemma3" and config.sliding_windows[5] is None and config.sliding_windows[4] == 6
    ref = Gemma3ForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
    prompts = random_prompts([5, 13], 300)
    got = PagedRun(model, config, paged_batcher(block_size=4, num_blocks=40)).step(list(enumerate(prompts)))
    for prompt, logits in zip(prompts, got, strict=True):
        with torch.no_grad():
            want = ref(input_ids=torch.tensor([prompt])).logits[0]
        assert rel_err(logits, want) < 1e-4
