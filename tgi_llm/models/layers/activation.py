"""The MLP activations of the supported families, by their `hidden_act` names in transformers."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_fast": partial(F.gelu, approximate="tanh"),
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function for `hidden_act` (or Gemma's `hidden_activation`), or a ValueError naming the choices."""
    if name not in ACTIVATIONS:
        raise ValueError(f"`hidden_act` {name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]
