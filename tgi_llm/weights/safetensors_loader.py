"""Read tensors from a HF model directory's safetensors files, whole or as a slice.

Slices exist for tensor parallelism: a rank reads only its part of each weight
(`load_sharded`), which is what keeps per-rank memory at 1/world_size.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class Shard:
    """Which slice of the weights this process holds (Megatron-style tensor parallelism)."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world of size {self.world_size}")


NO_SHARD = Shard()


#: Where multimodal checkpoints keep their language model (original and transformers >= 4.52 layouts).
_LANGUAGE_MODEL_PREFIXES = {"language_model.model.": "model.", "model.language_model.": "model.",
                            "language_model.lm_head.": "lm_head."}


def _language_model_names(names) -> dict[str, str]:
    """A multimodal checkpoint's language-model tensors under a text model's names ("model.layers.0...",
    "lm_head.weight"); empty for a text model's own checkpoint."""
    if "model.embed_tokens.weight" in names:
        return {}
    return {text + name[len(prefix):]: name for name in names
            for prefix, text in _LANGUAGE_MODEL_PREFIXES.items() if name.startswith(prefix)}


class SafetensorsWeights:
    """Name -> tensor access over `model.safetensors` or a sharded index; files are opened lazily."""

    def __init__(self, model_dir: str | Path, device: str | torch.device = "cpu") -> None:
        self.model_dir = Path(model_dir)
        self.device = str(device)
        self._file_of = self._index(self.model_dir)
        self._stored = _language_model_names(self._file_of)  # name read -> name in the file, where they differ
        self._file_of.update({name: self._file_of[stored] for name, stored in self._stored.items()})
        self._handles: dict[str, Any] = {}

    @staticmethod
    def _index(model_dir: Path) -> dict[str, str]:
        index = model_dir / INDEX_FILE
        if index.is_file():
            return dict(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
        single = model_dir / SINGLE_FILE
        if single.is_file():
            with safe_open(str(single), framework="pt") as f:
                return {name: SINGLE_FILE for name in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
        raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}")

    def _handle(self, name: str) -> Any:
        try:
            filename = self._file_of[name]
        except KeyError:
            raise KeyError(f"weight {name!r} not found in {self.model_dir}") from None
        handle = self._handles.get(filename)
        if handle is None:
            handle = safe_open(str(self.model_dir / filename), framework="pt", device=self.device)
            self._handles[filename] = handle
        return handle

    def names(self) -> list[str]:
        return sorted(self._file_of)

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def shape(self, name: str) -> list[int]:
        return list(self.get_slice(name).get_shape())

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._handle(name).get_tensor(self._stored.get(name, name))

    def get_slice(self, name: str) -> Any:
        """A lazy view: index it (`s[a:b]`, `s[:, a:b]`) to read only that part from disk."""
        return self._handle(name).get_slice(self._stored.get(name, name))

    def load_sharded(self, name: str, dim: int | None, shard: Shard = NO_SHARD) -> torch.Tensor:
        """The `shard.rank`-th of `world_size` equal chunks along `dim` (the whole tensor if dim is None)."""
        if dim is None or shard.world_size == 1:
            return self.get_tensor(name)
        size = self.shape(name)[dim]
        if size % shard.world_size:
            raise ValueError(f"{name}: dim {dim} of size {size} not divisible by {shard.world_size}")
        chunk = size // shard.world_size
        index: list[slice] = [slice(None)] * (dim + 1)
        index[dim] = slice(shard.rank * chunk, (shard.rank + 1) * chunk)
        return self.get_slice(name)[tuple(index)]

    def iter_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name in self.names():
            yield name, self.get_tensor(name)
