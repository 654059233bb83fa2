"""Random LoRA adapters made with PEFT over a model directory, as a user's fine-tune would be saved."""

from __future__ import annotations

from pathlib import Path

import torch

ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(base_dir: Path, out: Path, seed: int, r: int = 8, targets=ALL_MODULES, scale: float = 0.3,
                 **config) -> Path:
    """An adapter with random A and B (PEFT starts B at zero, which would change nothing), saved to `out`."""
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config.setdefault("lora_alpha", 2 * r)
    model = get_peft_model(base, LoraConfig(r=r, target_modules=list(targets), init_lora_weights=False, **config))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0, scale)
    model.save_pretrained(out)
    return out


def peft_reference(base_dir: Path, adapter_dir: Path | None):
    """transformers + PEFT on the same weights (the base model alone where `adapter_dir` is None)."""
    import transformers
    from peft import PeftModel

    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    return base if adapter_dir is None else PeftModel.from_pretrained(base, adapter_dir).eval()
