"""LoRA through the engine against transformers + PEFT on the same weights: each adapter's greedy tokens, alone
and in one batch mixing four adapters and the base model (each sequence equal to its own run alone), through
the prefix cache and chunked prefill, and on a quantized base against the same dequantized base plus the
adapter."""

from __future__ import annotations

import pytest
import torch

from tests.models.parity import rel_err
from tgi_llm import LLM
from tgi_llm.errors import ValidationError

from .peft_adapters import make_adapter, peft_reference

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a village", "1, 2, 3, 4,",
           "Translate to German: good morning"]


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("adapters")
    return {
        "all8": str(make_adapter(tiny_llama_dir, tmp / "all8", 1, r=8)),
        "qv4": str(make_adapter(tiny_llama_dir, tmp / "qv4", 2, r=4, targets=("q_proj", "v_proj"))),
        "mlp16": str(make_adapter(tiny_llama_dir, tmp / "mlp16", 3, r=16,
                                  targets=("gate_proj", "up_proj", "down_proj"), use_rslora=True)),
        "attn2": str(make_adapter(tiny_llama_dir, tmp / "attn2", 4, r=2, targets=("k_proj", "o_proj"))),
    }


@pytest.fixture(scope="module")
def llm(tiny_llama_dir, adapters):
    spec = ",".join(f"{name}={path}" for name, path in adapters.items())
    with LLM(str(tiny_llama_dir), lora_adapters=spec, max_loras=4, speculate=0, max_batch_total_tokens=4096) as llm:
        yield llm


def _greedy_reference(ref, tokenizer, prompt: str, n: int) -> list[int]:
    ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(ids):].tolist()


def _params(adapter: str | None, n: int = 12) -> dict:
    return {"max_new_tokens": n, "ignore_eos": True} | ({"adapter_id": adapter} if adapter else {})


def test_each_adapter_is_peft_and_a_mixed_batch_is_each_alone(llm, tiny_llama_dir, adapters):
    names = [None, *adapters]
    alone = {name: llm.generate([PROMPTS[i]], [_params(name)])[0].token_ids for i, name in enumerate(names)}
    mixed = llm.generate(PROMPTS, [_params(name) for name in names])
    assert [r.token_ids for r in mixed] == [alone[name] for name in names]
    outputs = {tuple(tokens) for tokens in alone.values()}
    assert len(outputs) == len(names)  # every adapter changes the answer
    for i, name in enumerate(names):
        ref = peft_reference(tiny_llama_dir, adapters[name] if name else None)
        assert alone[name] == _greedy_reference(ref, llm.tokenizer, PROMPTS[i], 12), name


def test_unknown_adapters_are_refused_by_name(llm):
    with pytest.raises(ValidationError, match="'nope' is not loaded"):
        llm.generate(["hi"], [_params("nope")])


def test_the_prefix_cache_keeps_adapters_apart(llm):
    prompt = "A long shared system prompt that fills several blocks of the cache. " * 4
    first = llm.generate([prompt], [_params("all8", 4)])[0]
    again = llm.generate([prompt], [_params("all8", 4)])[0]
    other = llm.generate([prompt], [_params("qv4", 4)])[0]
    base = llm.generate([prompt], [_params(None, 4)])[0]
    assert again.final.cached_tokens > 0 and again.token_ids == first.token_ids
    assert other.final.cached_tokens == 0 and base.final.cached_tokens == 0


def test_chunked_prefill_with_an_adapter_is_peft(tiny_llama_dir, adapters):
    prompt = "Chunked prompts run their adapter on every chunk of the prompt. " * 6
    with LLM(str(tiny_llama_dir), lora_adapters=f"all8={adapters['all8']}", speculate=0, max_batch_prefill_tokens=32,
             max_batch_total_tokens=4096) as small_steps:
        got = small_steps.generate([prompt], [_params("all8", 8)])[0].token_ids
    ref = peft_reference(tiny_llama_dir, adapters["all8"])
    assert got == _greedy_reference(ref, small_steps.tokenizer, prompt, 8)


def test_more_adapters_than_slots_take_turns(tiny_llama_dir, adapters):
    spec = ",".join(f"{name}={path}" for name, path in adapters.items())
    with LLM(str(tiny_llama_dir), lora_adapters=spec, max_loras=1, speculate=0, max_batch_total_tokens=4096) as one:
        names = list(adapters)
        together = one.generate(PROMPTS[:4], [_params(name) for name in names])
        alone = [one.generate([PROMPTS[i]], [_params(name)])[0] for i, name in enumerate(names)]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]


def test_a_quantized_base_with_an_adapter_is_the_dequantized_base_plus_the_adapter(tiny_llama_dir, tmp_path,
                                                                                     paged_batcher):
    """The adapter adds no error of its own to the base's quantization error (an adapter of a fine-tune's size:
    a random one 6x larger amplifies the base's rounding through the layers, with or without us)."""
    from tgi_llm.kv_cache import allocate_kv_cache
    from tgi_llm.lora.weights import LoraBatch, ModelLora
    from tgi_llm.models.loader import load_model
    from tgi_llm.quant.modes import parse_quantize

    model, config = load_model(tiny_llama_dir, quantization=parse_quantize("int8", None))
    slots = ModelLora.allocate(config, 1, 8, torch.device("cpu"), torch.float32)
    model.attach_lora(slots)
    adapter = str(make_adapter(tiny_llama_dir, tmp_path / "small", 5, r=8, scale=0.05))
    slots.load(0, adapter)
    tokens = torch.randint(3, 1000, (11,), generator=torch.Generator().manual_seed(0)).tolist()
    caches = allocate_kv_cache(config, 16, 4)

    def ours(lora: LoraBatch | None) -> torch.Tensor:
        batcher = paged_batcher(block_size=4, num_blocks=16)
        ids, positions, attn = batcher.step([(0, tokens)])
        return model.compute_logits(model(ids, positions, caches, attn, lora))

    reference = peft_reference(tiny_llama_dir, None)
    with torch.no_grad():  # the reference's linears take our dequantized weights
        for layer, ref_layer in zip(model.layers, reference.model.layers, strict=True):
            attn, mlp = ref_layer.self_attn, ref_layer.mlp
            q, k, v = layer.qkv.dense_weight().split([attn.q_proj.out_features, attn.k_proj.out_features,
                                                      attn.v_proj.out_features])
            gate, up = layer.gate_up.dense_weight().chunk(2)
            for module, weight in ((attn.q_proj, q), (attn.k_proj, k), (attn.v_proj, v),
                                   (attn.o_proj, layer.o_proj.dense_weight()), (mlp.gate_proj, gate),
                                   (mlp.up_proj, up), (mlp.down_proj, layer.down.dense_weight())):
                module.weight.copy_(weight)
        base_error = rel_err(ours(None), reference(torch.tensor([tokens])).logits[0])
        from peft import PeftModel

        with_adapter = PeftModel.from_pretrained(reference, adapter).eval()
        lora_error = rel_err(ours(LoraBatch.of([0] * len(tokens))), with_adapter(torch.tensor([tokens])).logits[0])
    assert lora_error < max(1.5 * base_error, 1e-4), (lora_error, base_error)


def test_two_shards_split_every_adapter_as_their_layers(tiny_llama_dir, adapters):
    """Tensor parallelism: each rank holds its slice of A or B; a mixed batch is what one shard gives."""
    spec = ",".join(f"{name}={path}" for name, path in adapters.items())
    names = [None, *adapters]
    params = [_params(name) for name in names]
    with LLM(str(tiny_llama_dir), lora_adapters=spec, max_loras=2, speculate=0, max_batch_total_tokens=4096) as one:
        want = [r.token_ids for r in one.generate(PROMPTS, params)]
    with LLM(str(tiny_llama_dir), lora_adapters=spec, max_loras=2, speculate=0, max_batch_total_tokens=4096,
             num_shard=2) as two:
        assert [r.token_ids for r in two.generate(PROMPTS, params)] == want
