"""LoRA adapters on one base model, many served together.

- spec.py: the `--lora-adapters id=path,...` list (torch-free: the launcher reads it).
- targets.py: which linears of a layer an adapter may change, under PEFT's module names.
- peft_adapter.py: a PEFT adapter directory read and checked against the model (one shard's slice).
- weights.py: the resident adapters' A and B in fixed slots beside each linear, and the torch product.
- registry.py: the engine's adapters by name, which slot each holds, and the requests using them.
"""
