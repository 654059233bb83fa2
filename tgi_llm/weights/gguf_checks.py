"""What a GGUF must be for us to serve it, checked before it is converted, so that nothing is served wrong.

A loader that maps the tensors it knows and drops the rest serves a Mixtral labelled `llama` as a dense
Llama, or a model without its biases, without a word. Here the architecture and every tensor name are
checked against the layout of a family we serve (gguf_layout.py); what does not fit is refused at start-up,
naming it. The converted model's own tensor list is checked against the file's later (gguf.py).
"""

from __future__ import annotations

from tgi_llm.weights.gguf_config import Metadata
from tgi_llm.weights.gguf_layout import LAYOUTS, GGUFLayout, layout_for, place


def check_servable(reader, name: str) -> GGUFLayout:
    """The layout of the GGUF `reader` reads; ValueError naming the file and what is wrong where we would
    serve it wrongly."""
    meta = Metadata(reader, name)
    names = [t.name for t in reader.tensors]
    layout = layout_for(meta.arch, names, meta.get("expert_count"))
    if layout is None:
        raise ValueError(f"{name}: GGUF architecture {meta.arch!r} is not served; GGUF files of "
                         f"{', '.join(sorted(LAYOUTS))} (and Mixtral as llama.cpp writes it) are "
                         "(serve the Hugging Face checkpoint instead)")
    config_tensors = {f"{t}.weight" for t in layout.config_tensors}
    for tensor in names:
        if tensor not in config_tensors and place(layout, tensor) is None:
            raise ValueError(f"{name}: tensor {tensor!r} is not part of the {meta.arch} architecture this server "
                             "reads (a GGUF converted from another architecture?); refusing to serve it")
    return layout
