"""A GGUF's tensors dequantized to float32 under the names and in the layout of the Hugging Face checkpoint.

Dequantized values are exact in float32. What llama.cpp's converter changed is undone (gguf_layout.py):
q/k rows put back in Hugging Face's rotary order, 1 subtracted from Gemma's norms, stacked experts split
into one matrix per expert.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from gguf.quants import dequantize

from tgi_llm.weights.gguf_layout import GGUFLayout, permuted_heads, place, unpermute_rows


def hf_tensors(reader, layout: GGUFLayout, num_heads: int, num_kv_heads: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, float32 tensor) for every weight tensor of the GGUF `reader` reads."""
    for tensor in reader.tensors:
        where = place(layout, tensor.name)
        if where is None:
            continue  # read into config.json (rope factors)
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        # F32 tensors come back as views of the read-only file map; torch wants memory it may write
        values = torch.from_numpy(array if array.flags.writeable else array.copy())
        if where.is_norm and layout.norm_plus_one:
            values = values - 1.0
        heads = permuted_heads(layout, where.hf_name, num_heads, num_kv_heads)
        if heads is not None:
            values = values[unpermute_rows(values.shape[0], heads)]
        if where.per_expert:
            for expert, matrix in enumerate(values):
                yield where.hf_name.format(e=expert), matrix.contiguous()
        else:
            yield where.hf_name, values.contiguous()
