"""Where each tensor of a llama.cpp GGUF lives in the Hugging Face checkpoint of the same model, per architecture.

One table per llama.cpp architecture we serve (the names gguf-py's tensor map gives them), and what llama.cpp's
converter did to the values on the way in, so the way back is exact: Llama-style q/k rows permuted for its
rotary layout, Gemma's norms stored as 1 + w, experts stacked into one 3-D tensor per projection. Both the
conversion to a float directory (gguf.py) and the quantized tensors served from the file (gguf_native.py)
name tensors through here, so the two cannot disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ATTENTION = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj"}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_LLAMA = {"attn_norm": "input_layernorm", **_ATTENTION, "ffn_norm": "post_attention_layernorm", **_MLP}
#: Gemma 2/3 and OLMo 2 normalise sublayer outputs too; llama.cpp's `ffn_norm` is Gemma's pre-MLP norm.
_SANDWICH = {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_GEMMA2 = {"attn_norm": "input_layernorm", **_ATTENTION, "ffn_norm": "pre_feedforward_layernorm", **_SANDWICH,
           **_MLP}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
#: llama.cpp's expert tensors, stacked over experts, by the projection they hold.
_EXPERT_PROJECTIONS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@dataclass(frozen=True)
class GGUFLayout:
    """A llama.cpp architecture as Hugging Face names it."""

    model_type: str
    architecture: str  # config.json's `architectures` entry
    layer: dict[str, str]  # GGUF tensor in block N -> its name under model.layers.N. (the MoE router included)
    #: MoE: HF names of one expert's (gate, up, down), `{e}` for the expert
    experts: tuple[str, str, str] | None = None
    permuted_qk: bool = False  # llama.cpp's converter reorders q/k rows (LlamaModel.permute)
    norm_plus_one: bool = False  # Gemma: the file holds 1 + w for every norm weight
    #: tensors read into config.json, not weights
    config_tensors: tuple[str, ...] = field(default=("rope_freqs",))


LAYOUTS = {
    "llama": GGUFLayout("llama", "LlamaForCausalLM", _LLAMA, permuted_qk=True),
    "qwen2": GGUFLayout("qwen2", "Qwen2ForCausalLM", _LLAMA),
    "qwen3": GGUFLayout("qwen3", "Qwen3ForCausalLM", {**_LLAMA, **_QK_NORMS}),
    "gemma": GGUFLayout("gemma", "GemmaForCausalLM", _LLAMA, norm_plus_one=True),
    "gemma2": GGUFLayout("gemma2", "Gemma2ForCausalLM", _GEMMA2, norm_plus_one=True),
    "gemma3": GGUFLayout("gemma3_text", "Gemma3ForCausalLM", {**_GEMMA2, **_QK_NORMS}, norm_plus_one=True),
    "phi3": GGUFLayout("phi3", "Phi3ForCausalLM",
                       {"attn_norm": "input_layernorm", "attn_qkv": "self_attn.qkv_proj",
                        "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                        "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"},
                       config_tensors=("rope_factors_long", "rope_factors_short")),
    "granite": GGUFLayout("granite", "GraniteForCausalLM", _LLAMA, permuted_qk=True),
    "olmo2": GGUFLayout("olmo2", "Olmo2ForCausalLM", {**_ATTENTION, **_QK_NORMS, **_SANDWICH, **_MLP}),
    "smollm3": GGUFLayout("smollm3", "SmolLM3ForCausalLM", _LLAMA, permuted_qk=True),
    "qwen3moe": GGUFLayout("qwen3_moe", "Qwen3MoeForCausalLM",
                           {**_LLAMA, **_QK_NORMS, "ffn_gate_inp": "mlp.gate"},
                           experts=("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj",
                                    "mlp.experts.{e}.down_proj")),
}
#: llama.cpp converts Mixtral to its `llama` architecture with expert tensors added.
MIXTRAL = GGUFLayout("mixtral", "MixtralForCausalLM", {**_LLAMA, "ffn_gate_inp": "block_sparse_moe.gate"},
                     permuted_qk=True,
                     experts=("block_sparse_moe.experts.{e}.w1", "block_sparse_moe.experts.{e}.w3",
                              "block_sparse_moe.experts.{e}.w2"))


def layout_for(arch: str, tensor_names, expert_count: int | None = None) -> GGUFLayout | None:
    """The layout of a file of llama.cpp's `arch` with these tensors (and `expert_count` metadata, where read):
    a `llama` with experts is a Mixtral."""
    experts = expert_count or any("_exps." in name for name in tensor_names)
    return MIXTRAL if arch == "llama" and experts else LAYOUTS.get(arch)


@dataclass(frozen=True)
class TensorPlace:
    """Where one GGUF tensor goes: one HF tensor, or (experts) one per expert with `{e}` in the name."""

    hf_name: str
    per_expert: bool = False
    is_norm: bool = False


def place(layout: GGUFLayout, gguf_name: str) -> TensorPlace | None:
    """The HF name for a GGUF tensor name (with its .weight/.bias leaf), or None for one this layout lacks."""
    base, _, leaf = gguf_name.rpartition(".")
    if leaf not in ("weight", "bias"):
        return None
    if base in _TOP:
        return TensorPlace(f"{_TOP[base]}.{leaf}", is_norm=base == "output_norm")
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if match is None:
        return None
    block, kind = match.groups()
    prefix = f"model.layers.{block}."
    if layout.experts is not None and kind in _EXPERT_PROJECTIONS and leaf == "weight":
        expert = layout.experts[_EXPERT_PROJECTIONS.index(kind)]
        return TensorPlace(f"{prefix}{expert}.weight", per_expert=True)
    if kind in layout.layer:
        return TensorPlace(f"{prefix}{layout.layer[kind]}.{leaf}", is_norm=kind.endswith("norm"))
    return None


def permuted_heads(layout: GGUFLayout, hf_name: str, num_heads: int, num_kv_heads: int) -> int | None:
    """The head count llama.cpp permuted the rows of this tensor by (a q/k projection weight of a permuting
    layout), else None."""
    if not (layout.permuted_qk and hf_name.endswith(".weight")):
        return None
    return {"q_proj": num_heads, "k_proj": num_kv_heads}.get(hf_name.split(".")[-2])


def unpermute_rows(n_rows: int, n_head: int) -> list[int]:
    """Undo llama.cpp's q/k row permutation: the GGUF row each HF row comes from (as transformers' loader)."""
    dim = n_rows // n_head // 2
    return [h * 2 * dim + 2 * i + half for h in range(n_head) for half in range(2) for i in range(dim)]
