"""OLMo 2: norms on each block's output instead of its input, and an RMSNorm over the whole q and k
projections (which a shard, holding some heads, cannot compute alone)."""

from __future__ import annotations

from typing import Any

from tgi_llm.models.config import NormNames
from tgi_llm.models.family import Family


def _olmo2(cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        "norms": NormNames(attn_in=None, attn_out="post_attention_layernorm", mlp_in=None,
                           mlp_out="post_feedforward_layernorm"),
        "qk_norm": "projection",
        "tensor_parallel_refusal": "OLMo 2 normalizes q and k over all heads together, which one shard's heads "
                                   "cannot do alone",
    }


OLMO2 = Family("olmo2", ("olmo2",), ("Olmo2ForCausalLM",), _olmo2)
