"""The MLP activations of the supported families, by their `hidden_act` names in transformers."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from tgi_llm.models.config import ACTIVATION_NAMES, check_activation

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_fast": partial(F.gelu, approximate="tanh"),
}


assert set(ACTIVATIONS) == set(ACTIVATION_NAMES)


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function for `hidden_act` (or Gemma's `hidden_activation`), or a ValueError naming the choices."""
    check_activation(name)
    return ACTIVATIONS[name]
