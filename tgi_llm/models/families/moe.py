"""The mixtures of experts: Mixtral (Mistral's layers, every MLP a top-2 of 8 experts, renormalized) and
Qwen3-MoE (Qwen3's layers; `mlp_only_layers` and `decoder_sparse_step` keep some MLPs dense)."""

from __future__ import annotations

from typing import Any

from tgi_llm.models.config import MoeSpec
from tgi_llm.models.families.llama import qwen_windows
from tgi_llm.models.family import Family


def _mixtral(cfg: dict[str, Any]) -> dict[str, Any]:
    layers = cfg["num_hidden_layers"]
    return {"moe": MoeSpec(num_experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
                           intermediate_size=cfg["intermediate_size"], normalize=True, prefix="block_sparse_moe",
                           names=("w1", "w3", "w2"), sparse_layers=(True,) * layers)}


def _qwen3_moe(cfg: dict[str, Any]) -> dict[str, Any]:
    layers = cfg["num_hidden_layers"]
    dense = set(cfg.get("mlp_only_layers") or [])
    step = cfg.get("decoder_sparse_step", 1) or 1
    sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))
    return {
        "qk_norm": "head",
        **qwen_windows(cfg),
        "moe": MoeSpec(num_experts=cfg.get("num_experts") or cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
                       intermediate_size=cfg["moe_intermediate_size"], normalize=bool(cfg.get("norm_topk_prob")),
                       prefix="mlp", names=("gate_proj", "up_proj", "down_proj"), sparse_layers=sparse),
    }


MIXTRAL = Family("mixtral", ("mixtral",), ("MixtralForCausalLM",), _mixtral)
QWEN3_MOE = Family("qwen3_moe", ("qwen3_moe",), ("Qwen3MoeForCausalLM",), _qwen3_moe)
