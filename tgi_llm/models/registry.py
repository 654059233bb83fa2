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


def read_config(cfg: dict[str, Any]) -> ModelConfig:
    """The ModelConfig of a config.json's contents: the common fields, then its family's; a model no family
    serves goes through transformers' modeling code where that can serve it (backed_config.py)."""
    try:
        family = find_family(cfg)
    except ValueError as exc:
        from tgi_llm.models.backed_config import backed_config  # transformers' configs: only then

        return backed_config(cfg, str(exc))
    return ModelConfig(**{**common_fields(cfg), "family": family.name, **family.configure(cfg), "raw": dict(cfg)})


def read_config_dir(model_dir: str | Path) -> ModelConfig:
    return read_config(json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8")))
