"""The linears of a decoder layer that a LoRA adapter may change, and the PEFT module names that reach them.

A layer's q/k/v (and gate/up) run as one fused linear; an adapter has an A and B per checkpoint module, so
the fused linear has one adapter part per projection, in its output order. A family whose checkpoint
already fuses them (Phi-3's qkv_proj, gate_up_proj) has adapters over the fused module: its B is split into
the parts and each part takes the whole A. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LoraTarget:
    #: The DecoderLayer attribute that runs it: qkv, o_proj, gate_up, down.
    linear: str
    #: PEFT's module name of each output part, in order (q_proj, k_proj, v_proj).
    parts: tuple[str, ...]
    #: Each part's output rows in the whole model (unsharded).
    widths: tuple[int, ...]
    in_features: int
    #: How tensor parallelism splits it: "column" (output rows) or "row" (input columns).
    split: str
    #: The checkpoint's fused module covering every part (Phi-3's qkv_proj), where the family fuses them.
    fused: str | None = None

    def modules(self) -> tuple[str, ...]:
        return (self.fused,) if self.fused else self.parts

    def part_of(self, module: str) -> int | None:
        """Which part a checkpoint module (its name in the layer's block) is; None for the fused module."""
        return None if module == self.fused else self.parts.index(module)


#: A layer's targets by the module's path inside the layer (self_attn.q_proj), for one layer index.
LayerTargets = Callable[[int], dict[str, LoraTarget]]


def native_targets(config) -> LayerTargets:
    """The targets of a natively served family: the attention's and the dense MLP's projections."""
    return lambda index: layer_targets(config, index)


def layer_targets(config, index: int) -> dict[str, LoraTarget]:
    """By module path in the layer (self_attn.q_proj ... mlp.down_proj, or the fused names), what each reaches
    in layer `index`."""
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    targets = [
        LoraTarget("qkv", ("q_proj", "k_proj", "v_proj"), (q, kv, kv), hidden, "column",
                   "qkv_proj" if config.fused_qkv else None),
        LoraTarget("o_proj", ("o_proj",), (hidden,), q, "row"),
    ]
    if config.moe is None or not config.moe.sparse_layers[index]:
        targets += [
            LoraTarget("gate_up", ("gate_proj", "up_proj"), (inter, inter), hidden, "column",
                       "gate_up_proj" if config.fused_gate_up else None),
            LoraTarget("down", ("down_proj",), (hidden,), inter, "row"),
        ]
    return {f"{'self_attn' if t.linear in ('qkv', 'o_proj') else 'mlp'}.{module}": t
            for t in targets for module in t.modules()}
