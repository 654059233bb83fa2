"""LoRA on models served through transformers' own modeling code: any linear of a decoder layer, by its PEFT
name, through a hook on the module; logits against transformers + PEFT, rows of an adapter and of the base
model in one forward."""

from __future__ import annotations

import pytest
import torch

from tests.models.parity import rel_err
from tests.models.test_transformers_backed import BACKED
from tgi_llm.kv_cache import allocate_kv_cache
from tgi_llm.lora.peft_adapter import AdapterError
from tgi_llm.lora.weights import LoraBatch, ModelLora
from tgi_llm.models.loader import load_model
from tgi_llm.models.transformers_backed import TransformersCausalLM

from .peft_adapters import make_adapter, peft_reference

#: model_type -> the modules its adapter targets (PEFT's names in transformers' code)
TARGETS = {"gpt_neox": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
           "starcoder2": ("q_proj", "v_proj", "o_proj", "c_fc", "c_proj")}


@pytest.mark.parametrize("model_type", list(TARGETS))
def test_backed_models_take_adapters_on_their_own_linears(tiny_model_factory, paged_batcher, tmp_path, model_type):
    model_dir = tiny_model_factory(model_type, **BACKED[model_type])
    model, config = load_model(model_dir)
    assert isinstance(model, TransformersCausalLM)
    slots = ModelLora.allocate(config, 2, 8, torch.device("cpu"), torch.float32, targets=model.lora_targets())
    model.attach_lora(slots)
    adapter = make_adapter(model_dir, tmp_path / "a", 1, r=8, targets=TARGETS[model_type], scale=0.2)
    slots.load(1, str(adapter))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (9, 6)]
    batcher = paged_batcher(block_size=4, num_blocks=16)
    ids, positions, attn = batcher.step(list(enumerate(prompts)))
    rows = [1] * len(prompts[0]) + [-1] * len(prompts[1])
    got = model.compute_logits(model(ids, positions, allocate_kv_cache(config, 16, 4), attn, LoraBatch.of(rows)))
    with_adapter, base = peft_reference(model_dir, adapter), peft_reference(model_dir, None)
    with torch.no_grad():
        want = [with_adapter(torch.tensor([prompts[0]])).logits[0], base(torch.tensor([prompts[1]])).logits[0]]
    first, second = got.split([len(p) for p in prompts])
    assert rel_err(first, want[0]) < 1e-4 and rel_err(second, want[1]) < 1e-4
    assert rel_err(first, base(torch.tensor([prompts[0]])).logits[0]) > 1e-2  # the adapter mattered


def test_a_module_the_backed_model_lacks_is_named(tiny_model_factory, tmp_path):
    model_dir = tiny_model_factory("gpt_neox", **BACKED["gpt_neox"])
    model, config = load_model(model_dir)
    slots = ModelLora.allocate(config, 1, 8, torch.device("cpu"), torch.float32, targets=model.lora_targets())
    other = make_adapter(tiny_model_factory("starcoder2", **BACKED["starcoder2"]), tmp_path / "a", 2, r=4,
                         targets=("c_fc",))
    with pytest.raises(AdapterError, match="no such module .*attention.query_key_value"):
        slots.read(str(other))
