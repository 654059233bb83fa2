"""Linear, embedding and LM-head weights for the model, in the format `--quantize` chose.

Float checkpoints give float tensors (quantized here for `int8`/`int4`); a GGUF served natively gives
its quantized tensors from the file (gguf_native.py) and its float ones (norms) from the converted
directory. Tensor-parallel slicing happens before quantizing, or on the quantized rows / groups, so a
rank only ever holds its own part, once.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import nn

from tgi_llm.models.config import ModelConfig
from tgi_llm.quant.formats import QuantizedWeight, concat_rows, quantize_int4, quantize_int8
from tgi_llm.quant.linear import QuantLinear
from tgi_llm.quant.modes import Quantization
from tgi_llm.weights.gguf_native import GGUFQuantizedTensors, source_gguf
from tgi_llm.weights.safetensors_loader import NO_SHARD, SafetensorsWeights, Shard

logger = logging.getLogger(__name__)

Parallel = Literal["column", "row", "vocab", "replicated"]
_SPLIT_DIM: dict[str, int | None] = {"column": 0, "vocab": 0, "row": 1, "replicated": None}


def resolve_quantization(model_dir, quantization: Quantization | None, kernels_apply: bool = True) -> Quantization:
    """Unset: a directory converted from a GGUF that still exists runs its blocks, anything else floats.
    Where the quantized kernels do not apply (a GPU, or activations other than float32) an unset value
    means floats, so the default model also starts there; asked for explicitly, it is load_model's error."""
    gguf = source_gguf(model_dir)
    if quantization is None:
        if gguf is not None and not kernels_apply:
            logger.info("the GGUF's blocks run on the CPU with float32 activations only: dequantizing them")
        return Quantization("gguf" if gguf is not None and kernels_apply else "float")
    if quantization.mode == "gguf" and gguf is None:
        raise ValueError(f"`--quantize gguf` needs a .gguf model; {model_dir} holds float weights "
                         "(use --quantize int8 or int4 to quantize them on load)")
    return quantization


class WeightLoader:
    def __init__(self, model_dir, config: ModelConfig | None, quantization: Quantization | None,
                 shard: Shard = NO_SHARD, kernels_apply: bool = True) -> None:
        self.floats = SafetensorsWeights(model_dir)
        self.quantization = resolve_quantization(model_dir, quantization, kernels_apply)
        self.shard = shard
        self.gguf = None
        if self.quantization.mode == "gguf":
            self.gguf = GGUFQuantizedTensors(source_gguf(model_dir), config.num_attention_heads,
                                             config.num_key_value_heads)

    @property
    def quantized(self) -> bool:
        return self.quantization.mode != "float"

    def _quantized_part(self, name: str, dim: int | None) -> QuantizedWeight:
        qw = self.gguf.get(name)
        if dim is None or self.shard.world_size == 1:
            return qw
        size = qw.shape[dim]
        if size % self.shard.world_size:
            raise ValueError(f"{name}: dim {dim} of size {size} not divisible by {self.shard.world_size}")
        chunk = size // self.shard.world_size
        lo, hi = self.shard.rank * chunk, (self.shard.rank + 1) * chunk
        if dim == 0:
            return qw.rows(slice(lo, hi))
        try:
            return qw.columns(lo, hi)
        except ValueError as exc:
            raise ValueError(f"{name} ({qw.source}) cannot be split over {self.shard.world_size} shards: {exc}; "
                             "start with --quantize float or fewer --num-shard") from None

    def _float(self, names: list[str], dim: int | None) -> torch.Tensor:
        return torch.cat([self.floats.load_sharded(n, dim, self.shard) for n in names], dim=0)

    def _quantize(self, weight: torch.Tensor, head: bool = False) -> QuantizedWeight:
        """int4 keeps the LM head (and tied embedding) int8 in groups of 32, as Q4 GGUF files keep theirs
        in Q6_K/Q8_0: it is the most sensitive matrix and decides every token."""
        q, k = self.quantization, weight.shape[1]
        group = 32 if head and q.mode == "int4" else q.group or 32
        if k % group:
            raise ValueError(f"--quantize-group-size {group} does not divide the input size {k} of a "
                             f"{tuple(weight.shape)} weight; choose a divisor of it")
        if q.mode == "int8" or head:
            return quantize_int8(weight, group)
        return quantize_int4(weight, group)

    def linear_weight(self, prefixes: list[str], parallel: Parallel) -> torch.Tensor | QuantizedWeight:
        dim = _SPLIT_DIM[parallel]
        names = [f"{p}.weight" for p in prefixes]
        if self.gguf is not None and all(n in self.gguf for n in names):
            return concat_rows([self._quantized_part(n, dim) for n in names])
        weight = self._float(names, dim)
        return self._quantize(weight) if self.quantization.on_load else weight

    def fused_linear(self, prefix: str, sizes: list[int], bias: bool, make_float) -> nn.Module:
        """A column-parallel linear stored as one weight of `sizes` parts (Phi-3's qkv_proj, gate_up_proj):
        each shard takes its slice of every part."""
        if self.shard.world_size == 1:
            return self.linear([prefix], "column", bias, make_float)
        if self.gguf is not None and f"{prefix}.weight" in self.gguf:
            raise ValueError(f"{prefix}: a GGUF's fused weight cannot be split over shards; start with "
                             "--quantize float or one shard")

        def sliced(tensor: torch.Tensor) -> torch.Tensor:
            parts = []
            for part in tensor.split(sizes, dim=0):
                if part.shape[0] % self.shard.world_size:
                    raise ValueError(f"{prefix}: a part of {part.shape[0]} rows cannot be split over "
                                     f"{self.shard.world_size} shards")
                parts.append(part.chunk(self.shard.world_size, dim=0)[self.shard.rank])
            return torch.cat(parts, dim=0)

        weight = sliced(self.floats.get_tensor(f"{prefix}.weight"))
        b = sliced(self.floats.get_tensor(f"{prefix}.bias")) if bias else None
        if self.quantization.on_load:
            return QuantLinear(self._quantize(weight), b)
        return make_float(weight, b)

    def bias(self, prefixes: list[str], parallel: Parallel) -> torch.Tensor:
        """Row-parallel bias lives on rank 0 only since the partial outputs are summed."""
        if parallel == "row":
            b = self.floats.get_tensor(f"{prefixes[0]}.bias")
            return b if self.shard.rank == 0 else torch.zeros_like(b)
        return torch.cat([self.floats.load_sharded(f"{p}.bias", 0, self.shard) for p in prefixes], dim=0)

    def linear(self, prefixes: list[str], parallel: Parallel, bias: bool, make_float) -> nn.Module:
        weight = self.linear_weight(prefixes, parallel)
        b = self.bias(prefixes, parallel) if bias else None
        return QuantLinear(weight, b) if isinstance(weight, QuantizedWeight) else make_float(weight, b)

    def vocab(self, name: str) -> torch.Tensor | QuantizedWeight:
        """The embedding or an untied LM head, vocab-parallel."""
        if self.gguf is not None and name in self.gguf:
            return self._quantized_part(name, 0)
        weight = self.floats.load_sharded(name, 0, self.shard)
        return self._quantize(weight, head=True) if self.quantization.on_load else weight
