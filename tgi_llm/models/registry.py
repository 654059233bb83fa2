"""Which family serves a checkpoint: found by its `architectures` entry, else by its `model_type`.

A family (models/families/) says how its config.json maps onto ModelConfig; the decoder (models/decoder.py)
builds every family from those facts. Adding a family is one file there and one line in FAMILIES.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tgi_llm.models.config import ModelConfig, common_fields
from tgi_llm.models.families import FAMILIES
from tgi_llm.models.family import Family


def find_family(cfg: dict[str, Any]) -> Family:
    """The family for a config.json, or a ValueError that lists what is served."""
    archs = list(cfg.get("architectures") or [])
    model_type = cfg.get("model_type", "")
    for family in FAMILIES:
        if any(a in family.architectures for a in archs):
            return family
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    served = ", ".join(sorted(t for f in FAMILIES for t in f.model_types))
    raise ValueError(f"model_type {model_type!r} (architectures {archs}) is not supported; supported model types: "
                     f"{served}")


#: Multimodal checkpoints whose language model a native family serves on its own (text in, text out).
LANGUAGE_MODEL_OF = {"Gemma3ForConditionalGeneration": "gemma3_text"}


def _language_model(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The text model's config.json of a multimodal checkpoint listed in LANGUAGE_MODEL_OF, with transformers'
    defaults for what the checkpoint leaves out of its text_config (Hub configs list only what differs)."""
    model_type = next((LANGUAGE_MODEL_OF[a] for a in cfg.get("architectures") or [] if a in LANGUAGE_MODEL_OF), None)
    if model_type is None or not isinstance(cfg.get("text_config"), dict):
        return None
    from transformers import AutoConfig  # its config classes: only for these checkpoints

    config = AutoConfig.for_model(**{**cfg["text_config"], "model_type": model_type})
    text = config.to_dict()
    for key in ("tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
        if key in cfg and key not in cfg["text_config"]:
            text[key] = cfg[key]
    return {**text, "architectures": [type(config).__name__.replace("Config", "ForCausalLM")]}


def read_config(cfg: dict[str, Any]) -> ModelConfig:
    """The ModelConfig of a config.json's contents: the common fields, then its family's; a model no family
    serves goes through transformers' modeling code where that can serve it (backed_config.py). A multimodal
    checkpoint of LANGUAGE_MODEL_OF is served as its language model (its weights are read under the text
    model's names: weights/safetensors_loader.py)."""
    cfg = _language_model(cfg) or cfg
    try:
        family = find_family(cfg)
    except ValueError as exc:
        from tgi_llm.models.backed_config import backed_config  # transformers' configs: only then

        return backed_config(cfg, str(exc))
    return ModelConfig(**{**common_fields(cfg), "family": family.name, **family.configure(cfg), "raw": dict(cfg)})


def read_config_dir(model_dir: str | Path) -> ModelConfig:
    return read_config(json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8")))
