"""What a GGUF must be for us to serve it, checked before it is converted, so that nothing is served wrong.

transformers' GGUF loader maps the tensors it knows and drops the rest without a word, and reads no rope
scaling: a Mixtral that llama.cpp's converter labels `llama` loaded as a dense Llama with its experts left
behind, and a Llama 3 lost the frequency factors llama.cpp keeps in a `rope_freqs` tensor. Here the
architecture, every tensor name and the rope metadata are checked: what we cannot serve is refused at
start-up naming it; rope scaling the loader drops is returned as config.json entries for the converted
directory (models/layers/rotary.py reads them).
"""

from __future__ import annotations

import re
from typing import Any

#: llama.cpp architecture names whose GGUF files are served (through transformers' loader and our kernels).
SERVED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_TOP_TENSORS = {"token_embd", "output", "output_norm", "rope_freqs"}
_LAYER_TENSORS = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                  "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"}
#: config.json key for llama.cpp's per-frequency rope divisors (its `rope_freqs` tensor).
FREQ_FACTORS_KEY = "rope_freq_factors"


def _value(reader, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def check_servable(reader, name: str) -> dict[str, Any]:
    """Refuse (ValueError naming the file and what is wrong) a GGUF this server would serve wrongly; return
    the config.json entries the conversion must add for it."""
    arch = _value(reader, "general.architecture") or "llama"
    if arch not in SERVED_ARCHITECTURES:
        raise ValueError(f"{name}: GGUF architecture {arch!r} is not served; GGUF files of "
                         f"{', '.join(SERVED_ARCHITECTURES)} are (serve the Hugging Face checkpoint instead)")
    experts = _value(reader, f"{arch}.expert_count")
    if experts:
        raise ValueError(f"{name}: a mixture of experts ({experts} experts) in a GGUF is not served")
    for tensor in reader.tensors:
        base = tensor.name.rsplit(".", 1)[0] if tensor.name.endswith((".weight", ".bias")) else tensor.name
        layer = re.fullmatch(r"blk\.\d+\.(\w+)", base)
        if not (base in _TOP_TENSORS or (layer and layer.group(1) in _LAYER_TENSORS)):
            raise ValueError(f"{name}: tensor {tensor.name!r} is not part of the {arch} architecture this server "
                             "reads (a GGUF converted from another architecture?); refusing to serve it")
    extra: dict[str, Any] = {}
    scaling = _value(reader, f"{arch}.rope.scaling.type") or "none"
    factor = _value(reader, f"{arch}.rope.scaling.factor")
    theta = float(_value(reader, f"{arch}.rope.freq_base") or 10000.0)
    if scaling == "linear" and factor:
        extra["rope_parameters"] = {"rope_type": "linear", "factor": float(factor), "rope_theta": theta}
    elif scaling == "yarn" and factor:
        extra["rope_parameters"] = {"rope_type": "yarn", "factor": float(factor), "rope_theta": theta,
                                    "original_max_position_embeddings":
                                        int(_value(reader, f"{arch}.rope.scaling.original_context_length"))}
    elif scaling != "none":
        raise ValueError(f"{name}: rope scaling {scaling!r} is not served")
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        if freqs.tensor_type.name != "F32":
            raise ValueError(f"{name}: rope_freqs is {freqs.tensor_type.name}; F32 is read")
        extra[FREQ_FACTORS_KEY] = [float(f) for f in freqs.data]
    return extra
