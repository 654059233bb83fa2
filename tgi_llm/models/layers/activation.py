"""The MLP activations of the supported families, by their `hidden_act` names in transformers."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from tgi_llm.models.config import SILU_NAMES, TANH_GELU_NAMES, check_activation

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    **dict.fromkeys(SILU_NAMES, F.silu),
    "gelu": F.gelu,
    **dict.fromkeys(TANH_GELU_NAMES, partial(F.gelu, approximate="tanh")),
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function for `hidden_act` (or Gemma's `hidden_activation`), or a ValueError naming the choices."""
    check_activation(name)
    return ACTIVATIONS[name]
