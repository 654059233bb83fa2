"""Family: how one architecture's config.json maps onto ModelConfig (one per file in models/families/)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    #: config.json -> the ModelConfig fields that differ from `config.common_fields`.
    configure: Callable[[dict[str, Any]], dict[str, Any]]
