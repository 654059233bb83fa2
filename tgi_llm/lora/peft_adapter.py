"""A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors), read and checked against
the model it is to run on, and cut to one tensor-parallel shard's slice.

Every adapter part becomes (A [r, K], B [n, r] with its scaling folded in): scaling is lora_alpha / r, or
lora_alpha / sqrt(r) with rsLoRA, where alpha and r may differ per module (alpha_pattern, rank_pattern: r is
read from the tensors). What PEFT can save but this server cannot run is refused by name: DoRA, adapters on
the embeddings or the LM head (modules_to_save, lora_embedding_*), trained biases, Conv1D layouts, modules
outside the attention and MLP projections, and ranks over --max-lora-rank.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from tgi_llm.lora.targets import LayerTargets, LoraTarget, native_targets
from tgi_llm.weights.safetensors_loader import NO_SHARD, Shard

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

#: base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (an adapter name before .weight in
#: checkpoints saved with one): the layer, the module's path in it, A or B
_KEY = re.compile(r"^(?:base_model\.model\.)?(?:[\w.]*\.)?layers\.(\d+)\.([\w.]+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


class AdapterError(ValueError):
    """The adapter cannot run on this model; the message names the file, field or tensor."""


@dataclass(frozen=True)
class AdapterConfig:
    rank: int
    alpha: float
    rslora: bool
    alpha_pattern: dict[str, float]
    base_model: str | None

    def scaling(self, module_path: str, rank: int) -> float:
        alpha = self.alpha
        for pattern, value in self.alpha_pattern.items():  # PEFT matches a pattern against the name's end
            if re.match(rf"(.*\.)?({pattern})$", module_path):
                alpha = float(value)
                break
        return alpha / (math.sqrt(rank) if self.rslora else rank)


@dataclass(frozen=True)
class AdapterPart:
    """One part of one linear of one layer: A [r, K] and B [n, r] (scaled), this shard's slice."""

    layer: int
    linear: str
    part: int
    a: torch.Tensor
    b: torch.Tensor

    @property
    def rank(self) -> int:
        return self.a.shape[0]


def read_config(directory: Path) -> AdapterConfig:
    path = directory / CONFIG_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdapterError(f"{directory} is not a PEFT adapter: it has no {CONFIG_FILE}") from None
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path}: {exc}") from None
    if not isinstance(raw, dict):
        raise AdapterError(f"{path}: not a JSON object")
    if raw.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path}: `peft_type` {raw.get('peft_type')!r} is not supported (LORA only)")
    refusals = {
        "use_dora": "DoRA adapters are not supported",
        "modules_to_save": "adapters that replace whole modules (`modules_to_save`: an embedding or LM head) "
                           "are not supported",
        "fan_in_fan_out": "Conv1D (fan_in_fan_out) layouts are not supported",
        "lora_bias": "adapters with a trained bias are not supported",
        "use_qalora": "QA-LoRA adapters are not supported",
    }
    for field, why in refusals.items():
        if raw.get(field):
            raise AdapterError(f"{path}: `{field}` is set: {why}")
    if raw.get("bias", "none") != "none":
        raise AdapterError(f"{path}: `bias` {raw['bias']!r}: adapters that train biases are not supported")
    rank, alpha = raw.get("r", 8), raw.get("lora_alpha", 8)
    if not isinstance(rank, int) or rank <= 0 or not isinstance(alpha, (int, float)):
        raise AdapterError(f"{path}: `r` must be a positive integer and `lora_alpha` a number")
    alpha_pattern = raw.get("alpha_pattern") or {}
    if not isinstance(alpha_pattern, dict):
        raise AdapterError(f"{path}: `alpha_pattern` must be an object")
    return AdapterConfig(rank, float(alpha), bool(raw.get("use_rslora")), alpha_pattern,
                         raw.get("base_model_name_or_path"))


def adapter_rank(directory: str | Path) -> int:
    """The largest rank of the adapter's tensors (AdapterError where it has none to read)."""
    from safetensors import SafetensorError, safe_open

    path = Path(directory) / WEIGHTS_FILE
    read_config(Path(directory))
    try:
        with safe_open(str(path), "pt") as f:
            ranks = [f.get_slice(key).get_shape()[0] for key in f.keys() if ".lora_A" in key]
    except (SafetensorError, OSError) as exc:
        raise AdapterError(f"{path}: {exc}") from None
    if not ranks:
        raise AdapterError(f"{path}: no LoRA tensors")
    return max(ranks)


def read_adapter(directory: str | Path, model_config, max_rank: int, shard: Shard = NO_SHARD,
                 targets: LayerTargets | None = None) -> list[AdapterPart]:
    """Every part of the adapter at `directory`, checked against the model and cut to `shard`. `targets`: what
    each layer's modules reach (default: a native family's, from `model_config`)."""
    targets = targets or native_targets(model_config)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    if not directory.is_dir():
        raise AdapterError(f"LoRA adapter {directory}: no such directory")
    config = read_config(directory)
    path = directory / WEIGHTS_FILE
    if not path.is_file():
        found = "adapter_model.bin (convert it to safetensors)" if (directory / "adapter_model.bin").exists() else ""
        raise AdapterError(f"{directory} has no {WEIGHTS_FILE}" + (f"; it has {found}" if found else ""))
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise AdapterError(f"{path}: {exc}") from None
    pairs: dict[tuple[int, str, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        if "lora_embedding" in key or "lm_head" in key or "embed_tokens" in key:
            raise AdapterError(f"{path}: {key}: adapters on the embeddings or the LM head are not supported")
        if "lora_magnitude_vector" in key:
            raise AdapterError(f"{path}: {key}: DoRA adapters are not supported")
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(f"{path}: {key}: only the attention and MLP projections of the decoder layers "
                               "(q/k/v/o, gate/up/down) can take an adapter")
        layer, module, side = int(match[1]), match[2], match[3]
        pairs.setdefault((layer, module), {})[side] = tensor
    parts: list[AdapterPart] = []
    for (layer, module), ab in sorted(pairs.items()):
        where = f"{path}: layer {layer} {module}"
        if layer >= model_config.num_hidden_layers:
            raise AdapterError(f"{where}: the model has {model_config.num_hidden_layers} layers: the adapter was "
                               "made for another base model")
        reachable = targets(layer)
        target = reachable.get(module)
        if target is None:
            raise AdapterError(f"{where}: this model has no such module in that layer (it takes adapters on "
                               f"{', '.join(reachable)})")
        part_index = target.part_of(module.rsplit(".", 1)[-1])
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"{where}: lora_A and lora_B must both be present")
        a, b = ab["A"], ab["B"]
        rank = a.shape[0] if a.dim() == 2 else -1
        out = sum(target.widths) if part_index is None else target.widths[part_index]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != target.in_features or b.shape != (out, rank):
            raise AdapterError(f"{where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit the "
                               f"model's {target.in_features} inputs and {out} outputs: the adapter was made for "
                               "another base model")
        if rank > max_rank:
            raise AdapterError(f"{where}: rank {rank} is over the server's `max_lora_rank` {max_rank}")
        scale = config.scaling(f"model.layers.{layer}.{module}", rank)
        b = b.float() * scale
        a = a.float()
        if part_index is None:  # the fused module: every part takes the whole A and its rows of B
            for i, piece in enumerate(b.split(list(target.widths), dim=0)):
                parts.append(_sliced(layer, target, i, a, piece, shard))
        else:
            parts.append(_sliced(layer, target, part_index, a, b, shard))
    if not parts:
        raise AdapterError(f"{path}: no LoRA tensors")
    return parts


def _sliced(layer: int, target: LoraTarget, part: int, a: torch.Tensor, b: torch.Tensor, shard: Shard) -> AdapterPart:
    """Column-parallel linears split their output rows (B's rows), row-parallel ones their inputs (A's columns),
    as the base weight is split: row-parallel partial products are summed by the same all-reduce."""
    n = shard.world_size
    if n > 1:
        if target.split == "column":
            b = b.chunk(n, dim=0)[shard.rank]
        else:
            a = a.chunk(n, dim=1)[shard.rank]
    return AdapterPart(layer, target.linear, part, a.contiguous(), b.contiguous())
