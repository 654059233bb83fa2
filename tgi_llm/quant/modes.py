"""`--quantize` (env QUANTIZE): which weight format the model runs in, with TGI's names where they fit.

| value | weights run as |
| --- | --- |
| unset | a GGUF model: its own blocks (Q4_0/Q4_1/Q8_0/Q4_K/Q6_K) through the kernels; a float checkpoint: `--dtype` |
| `gguf` | the GGUF's own blocks (an error for a float checkpoint) |
| `float` | float weights in `--dtype` (a GGUF is dequantized, the pre-issue-17 behaviour) |
| `int8`, TGI's `eetq` and `bitsandbytes` | int8 weight-only, groups of 32, asymmetric or symmetric per group |
| `int4` | int4 weight-only, asymmetric, groups of 32 (Q4_1's layout); LM head int8 |

TGI's other values (awq, gptq, marlin, exl2, fp8, compressed-tensors, bitsandbytes-nf4/fp4) need
pre-quantized checkpoints or GPU kernels this server does not have: a start-up error names them.
"""

from __future__ import annotations

from dataclasses import dataclass

ACCEPTED = ("gguf", "float", "int8", "int4", "eetq", "bitsandbytes")
ALIASES = {"eetq": "int8", "bitsandbytes": "int8"}
TGI_UNSUPPORTED = ("awq", "compressed-tensors", "exl2", "fp8", "gptq", "marlin", "bitsandbytes-nf4",
                   "bitsandbytes-fp4")
#: Groups of 32 for both, as GGUF's Q8_0 and Q4_1: per-channel int8 (EETQ's) measured 96.9% top-1 agreement
#: on the default model against 98.8% for groups of 32 (docs/PERFORMANCE.md, "Accuracy of each weight format").
DEFAULT_GROUP = {"int4": 32, "int8": 32}


@dataclass(frozen=True)
class Quantization:
    """What the loader does with the weights: `gguf` (native blocks), `float`, `int8` or `int4`."""

    mode: str
    group: int | None = None  # int8/int4 group size along the input dim

    @property
    def on_load(self) -> bool:
        return self.mode in ("int8", "int4")

    def describe(self) -> str:
        if not self.on_load:
            return self.mode
        return f"{self.mode} weight-only, " + (f"groups of {self.group}" if self.group else "per channel")


def parse_quantize(value: str | None, group_size: int | None = None) -> Quantization | None:
    """None for unset (the loader picks by the weights: GGUF blocks natively, floats as --dtype)."""
    if value is None or not value.strip():
        if group_size is not None:
            raise ValueError("`quantize_group_size` needs `--quantize int8` or `--quantize int4`")
        return None
    name = value.strip().lower()
    if name in TGI_UNSUPPORTED:
        raise ValueError(f"`--quantize {name}` is not supported on this server (it needs pre-quantized "
                         f"weights or GPU kernels); accepted values: {', '.join(ACCEPTED)}")
    if name not in ACCEPTED:
        raise ValueError(f"`--quantize` must be one of {', '.join(ACCEPTED)}. Given: {value}")
    mode = ALIASES.get(name, name)
    if group_size is not None:
        if mode not in DEFAULT_GROUP:
            raise ValueError(f"`quantize_group_size` applies to int8 and int4 only, not `--quantize {name}`")
        step = 32 if mode == "int4" else 16
        if group_size <= 0 or group_size % step:
            raise ValueError(f"`quantize_group_size` for {mode} must be a positive multiple of {step}. "
                             f"Given: {group_size}")
    return Quantization(mode, group_size if group_size is not None else DEFAULT_GROUP.get(mode))
