"""A GGUF's metadata as the config.json of the Hugging Face checkpoint it was converted from.

llama.cpp keeps some settings as metadata and fixes others in its own code per architecture; both are
written back here as transformers names them, so the converted directory describes the model llama.cpp
would run. What llama.cpp fixes rather than stores: Gemma 2 alternates sliding and global layers and Gemma 3
has one global layer in six; Gemma scales queries by the head size (by hidden / heads for the 27B models);
SmolLM3 leaves rope out of every fourth layer; Qwen3-MoE renormalises its top-k router weights. Settings
we cannot serve (another rope scaling, KV head counts that differ between layers, values wider than keys)
are refused by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tgi_llm.weights.gguf_layout import GGUFLayout

#: config.json key for llama.cpp's per-frequency rope divisors (its `rope_freqs` tensor).
FREQ_FACTORS_KEY = "rope_freq_factors"
#: Gemma's 27B models, known to llama.cpp by their layer count, scale queries by hidden / heads.
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


class Metadata:
    """`arch.key` lookups into a GGUFReader's fields."""

    def __init__(self, reader, name: str) -> None:
        self.reader, self.name = reader, name
        self.arch = self.get("general.architecture", "llama", bare=True)

    def get(self, key: str, default: Any = None, bare: bool = False) -> Any:
        field = self.reader.fields.get(key if bare else f"{self.arch}.{key}")
        return default if field is None else field.contents()

    def required(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ValueError(f"{self.name}: GGUF metadata {self.arch}.{key} is missing")
        return value

    def tensor(self, name: str):
        return next((t for t in self.reader.tensors if t.name == name), None)


def _f32(value: Any) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def _uniform(meta: Metadata, key: str) -> int:
    value = meta.required(key)
    if isinstance(value, list):  # per-layer values: served only when every layer has the same
        if len(set(value)) != 1:
            raise ValueError(f"{meta.name}: {meta.arch}.{key} differs between layers ({value}); not served")
        value = value[0]
    return int(value)


def _rope(meta: Metadata, layout: GGUFLayout) -> dict[str, Any]:
    """rope_parameters (and llama.cpp's frequency factors) from the rope metadata and tensors."""
    theta = _f32(meta.get("rope.freq_base", 10000.0))
    scaling = meta.get("rope.scaling.type") or "none"
    factor = meta.get("rope.scaling.factor")
    original = meta.get("rope.scaling.original_context_length")
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    extra: dict[str, Any] = {}
    long, short = meta.tensor("rope_factors_long.weight"), meta.tensor("rope_factors_short.weight")
    if long is not None and short is not None:
        params = {"rope_type": "longrope", "rope_theta": theta, "long_factor": [float(f) for f in long.data],
                  "short_factor": [float(f) for f in short.data]}
        extra["original_max_position_embeddings"] = int(original)
    elif scaling == "linear" and factor:
        params = {"rope_type": "linear", "factor": _f32(factor), "rope_theta": theta}
    elif scaling == "yarn" and factor:
        params = {"rope_type": "yarn", "factor": _f32(factor), "rope_theta": theta,
                  "original_max_position_embeddings": int(original)}
    elif scaling not in ("none", "linear", "yarn"):
        raise ValueError(f"{meta.name}: rope scaling {scaling!r} is not served")
    freqs = meta.tensor("rope_freqs.weight")
    if freqs is not None:
        if freqs.tensor_type.name != "F32":
            raise ValueError(f"{meta.name}: rope_freqs is {freqs.tensor_type.name}; F32 is read")
        extra[FREQ_FACTORS_KEY] = [float(f) for f in freqs.data]
    if layout.model_type == "gemma3_text":  # local layers: their own base, never scaled
        local = {"rope_type": "default", "rope_theta": _f32(meta.get("rope.freq_base_swa", 1e4))}
        params = {"sliding_attention": local, "full_attention": params}
    return {"rope_parameters": params, **extra}


def _family(meta: Metadata, layout: GGUFLayout, cfg: dict[str, Any]) -> dict[str, Any]:
    """What one family adds to the common fields."""
    layers, heads, head_dim = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["head_dim"]
    window = meta.get("attention.sliding_window") or None
    out: dict[str, Any] = {}
    if layout.model_type in ("gemma", "gemma2", "gemma3_text"):
        out["hidden_activation"] = "gelu_pytorch_tanh"
    if layout.model_type in ("gemma2", "gemma3_text"):
        big = layers == _GEMMA_27B_LAYERS[meta.arch]
        out["query_pre_attn_scalar"] = cfg["hidden_size"] // heads if big else head_dim
        out["sliding_window"] = window
        pattern = 2 if layout.model_type == "gemma2" else 6
        out["layer_types"] = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                              for i in range(layers)]
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            value = meta.get(key)
            out[key] = None if value is None else _f32(value)
    elif layout.model_type == "phi3":
        out["sliding_window"] = window
        rope_dims = int(meta.get("rope.dimension_count", head_dim))
        out["partial_rotary_factor"] = rope_dims / head_dim
    elif layout.model_type == "granite":
        out.update(embedding_multiplier=_f32(meta.get("embedding_scale", 1.0)),
                   residual_multiplier=_f32(meta.get("residual_scale", 1.0)),
                   attention_multiplier=_f32(meta.get("attention.scale", head_dim ** -0.5)),
                   logits_scaling=_f32(meta.get("logit_scale", 1.0)))
    elif layout.model_type == "smollm3":
        out["no_rope_layers"] = [int((i + 1) % 4 != 0) for i in range(layers)]
    elif layout.model_type in ("mixtral", "qwen3_moe"):
        experts, used = int(meta.required("expert_count")), int(meta.required("expert_used_count"))
        if layout.model_type == "mixtral":
            out.update(num_local_experts=experts, num_experts_per_tok=used, sliding_window=None)
        else:
            out.update(num_experts=experts, num_experts_per_tok=used, norm_topk_prob=True, decoder_sparse_step=1,
                       mlp_only_layers=[], moe_intermediate_size=int(meta.required("expert_feed_forward_length")))
    elif layout.model_type == "qwen2":
        out["use_sliding_window"] = False
    if layout.model_type not in ("qwen2", "phi3"):  # Qwen2's q/k/v biases are fixed, Phi-3 has none
        out["attention_bias"] = meta.tensor("blk.0.attn_q.bias") is not None
        out["mlp_bias"] = meta.tensor("blk.0.ffn_up.bias") is not None
    return out


def hf_config(reader, layout: GGUFLayout, name: str) -> dict[str, Any]:
    """config.json entries (model_type included) for the model in the GGUF `reader` reads."""
    meta = Metadata(reader, name)
    hidden, heads = int(meta.required("embedding_length")), int(meta.required("attention.head_count"))
    head_dim = int(meta.get("attention.key_length") or hidden // heads)
    value_dim = int(meta.get("attention.value_length") or head_dim)
    if value_dim != head_dim:
        raise ValueError(f"{name}: keys of {head_dim} and values of {value_dim} per head are not served")
    tokens = meta.get("tokenizer.ggml.tokens", bare=True) or []
    cfg: dict[str, Any] = {
        "model_type": layout.model_type,
        "architectures": [layout.architecture],
        "hidden_size": hidden,
        "intermediate_size": int(meta.get("feed_forward_length") or 0) or None,
        "num_hidden_layers": int(meta.required("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": _uniform(meta, "attention.head_count_kv"),
        "head_dim": head_dim,
        "rms_norm_eps": _f32(meta.get("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(meta.get("context_length", 4096)),
        "vocab_size": int(meta.get("vocab_size") or len(tokens)),
        "tie_word_embeddings": meta.tensor("output.weight") is None,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id", bare=True),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id", bare=True),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id", bare=True),
        "unk_token_id": meta.get("tokenizer.ggml.unknown_token_id", bare=True),
    }
    if cfg["intermediate_size"] is None:
        del cfg["intermediate_size"]
    cfg.update(_rope(meta, layout))
    cfg.update(_family(meta, layout, cfg))
    return cfg
