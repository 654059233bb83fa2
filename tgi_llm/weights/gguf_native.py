"""A GGUF file's quantized tensors under their Hugging Face names, as the kernels' layouts (no fp32 copy).

The converted HF directory next to it (gguf.py) still supplies config, tokenizer and the float tensors
(norms); this adds the quantized linears and embedding, read from the GGUF the directory was made from.
llama.cpp stores Llama's q/k projections with their rows permuted for its rotary layout; the rows are put
back here as transformers' GGUF loader puts them back (a row permutation: exact for any block type).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch

from tgi_llm.quant.formats import QuantizedWeight
from tgi_llm.quant.gguf_blocks import SUPPORTED, from_gguf_blocks
from tgi_llm.weights.gguf_header import GGUFTensor, read_directory
from tgi_llm.weights.gguf_marker import MARKER_FILE

logger = logging.getLogger(__name__)

_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP = {"token_embd": "model.embed_tokens", "output": "lm_head"}
#: Architectures whose q/k rows llama.cpp's converter permutes.
_PERMUTED = {"llama", "mistral"}


def hf_name(gguf_name: str) -> str | None:
    base, _, leaf = gguf_name.rpartition(".")
    if base in _TOP:
        return f"{_TOP[base]}.{leaf}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m.group(2) in _LAYER:
        return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.{leaf}"
    return None


def source_gguf(model_dir: str | Path) -> Path | None:
    """The GGUF a converted directory was made from, when it still exists."""
    marker = Path(model_dir) / MARKER_FILE
    if not marker.is_file():
        return None
    path = Path(json.loads(marker.read_text(encoding="utf-8"))["gguf"])
    return path if path.is_file() else None


def _unpermute_rows(n_rows: int, n_head: int) -> torch.Tensor:
    """The row order transformers' `reverse_permute_weights` produces, as indices into the GGUF rows."""
    dim = n_rows // n_head // 2
    return torch.arange(n_rows).reshape(n_head, dim, 2).transpose(1, 2).reshape(n_rows)


class GGUFQuantizedTensors:
    """HF name -> QuantizedWeight for every tensor of a supported quantized type; float ones are not here."""

    def __init__(self, path: str | Path, num_heads: int, num_kv_heads: int) -> None:
        self.path = Path(path)
        directory = read_directory(self.path)
        arch = directory.architecture or "llama"
        self._tensors: dict[str, GGUFTensor] = {}
        for t in directory.tensors:
            name = hf_name(t.name)
            kind = t.type_name
            if name is None or kind in ("F32", "F16", "BF16"):
                continue
            if kind not in SUPPORTED:
                raise ValueError(f"{self.path.name}: tensor {t.name} is {kind}; served natively are "
                                 f"{', '.join(SUPPORTED)} (or start with --quantize float to dequantize)")
            self._tensors[name] = t
        self._heads = {"q_proj": num_heads, "k_proj": num_kv_heads} if arch in _PERMUTED else {}

    @property
    def types(self) -> dict[str, str]:
        """HF name -> GGML type, for every tensor here."""
        return {name: t.type_name for name, t in self._tensors.items()}

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def get(self, name: str) -> QuantizedWeight:
        t = self._tensors[name]
        k, rows = (int(d) for d in t.shape)  # GGUF lists dims innermost first
        qw = from_gguf_blocks(t.type_name, t.data, rows, k)
        proj = name.split(".")[-2]
        if proj in self._heads:
            qw = qw.rows(_unpermute_rows(rows, self._heads[proj]))
        return qw
