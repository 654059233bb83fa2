"""A GGUF file's quantized tensors under their Hugging Face names, as the kernels' layouts (no fp32 copy).

The converted HF directory next to it (gguf.py) still supplies config, tokenizer and the float tensors
(norms); this adds the quantized linears and embedding, read from the GGUF the directory was made from.
Names and the q/k row order come from gguf_layout.py, as for the float directory: llama.cpp stores Llama's
q/k projections with their rows permuted for its rotary layout, put back here (a row permutation: exact for
any block type); a mixture's stacked experts are served one quantized matrix per expert.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from tgi_llm.quant.formats import QuantizedWeight
from tgi_llm.quant.gguf_blocks import SUPPORTED, from_gguf_blocks
from tgi_llm.weights.gguf_header import GGUFTensor, read_directory
from tgi_llm.weights.gguf_layout import layout_for, permuted_heads, place, unpermute_rows
from tgi_llm.weights.gguf_marker import MARKER_FILE

logger = logging.getLogger(__name__)

def source_gguf(model_dir: str | Path) -> Path | None:
    """The GGUF a converted directory was made from, when it still exists."""
    marker = Path(model_dir) / MARKER_FILE
    if not marker.is_file():
        return None
    path = Path(json.loads(marker.read_text(encoding="utf-8"))["gguf"])
    return path if path.is_file() else None


class GGUFQuantizedTensors:
    """HF name -> QuantizedWeight for every tensor of a supported quantized type; float ones are not here."""

    def __init__(self, path: str | Path, num_heads: int, num_kv_heads: int) -> None:
        self.path = Path(path)
        directory = read_directory(self.path)
        self._layout = layout_for(directory.architecture or "llama", [t.name for t in directory.tensors])
        self._heads = (num_heads, num_kv_heads)
        self._tensors: dict[str, tuple[GGUFTensor, int | None]] = {}  # HF name -> (tensor, expert or None)
        for t in directory.tensors:
            where = place(self._layout, t.name) if self._layout is not None else None
            kind = t.type_name
            if where is None or kind in ("F32", "F16", "BF16"):
                continue
            if kind not in SUPPORTED:
                raise ValueError(f"{self.path.name}: tensor {t.name} is {kind}; served natively are "
                                 f"{', '.join(SUPPORTED)} (or start with --quantize float to dequantize)")
            if where.per_expert:
                self._tensors.update({where.hf_name.format(e=e): (t, e) for e in range(int(t.shape[2]))})
            else:
                self._tensors[where.hf_name] = (t, None)

    @property
    def types(self) -> dict[str, str]:
        """HF name -> GGML type, for every tensor here."""
        return {name: t.type_name for name, (t, _) in self._tensors.items()}

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def get(self, name: str) -> QuantizedWeight:
        t, expert = self._tensors[name]
        k, rows = (int(d) for d in t.shape[:2])  # GGUF lists dims innermost first; experts outermost
        data = t.data if expert is None else t.data.reshape(int(t.shape[2]), -1)[expert]
        qw = from_gguf_blocks(t.type_name, data, rows, k)
        heads = permuted_heads(self._layout, name, *self._heads)
        if heads is not None:
            qw = qw.rows(torch.tensor(unpermute_rows(rows, heads)))
        return qw
