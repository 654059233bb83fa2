"""The model's tokenizer in the front: chat templates and /tokenize need it; generation does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tgi_llm.front.errors import FrontError
from tgi_llm.front.schemas import SimpleToken

#: tokenizer_config.json classes that are transformers' generic tokenizers.json tokenizer (what a converted
#: GGUF directory names): loaded as that class directly, which AutoTokenizer would resolve to anyway.
GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(path: str | Path) -> Any:
    """transformers' tokenizer from a local HF directory (tokenizer.json, tokenizer_config.json).

    AutoTokenizer imports transformers' configuration modules, which import torch: ~280 MB of resident
    memory in a process that never computes a tensor. A directory whose tokenizer_config.json names the
    generic class skips it; any other class goes through AutoTokenizer, as before."""
    try:
        config = json.loads((Path(path) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    if isinstance(config, dict) and config.get("tokenizer_class") in GENERIC_CLASSES:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def tokenize(tokenizer: Any, text: str) -> list[SimpleToken]:
    """TGI's /tokenize: ids with the prompt slice each came from, special tokens as the engine adds them."""
    if tokenizer is None or not getattr(tokenizer, "is_fast", False):
        raise FrontError("No fast tokenizer or tokenizer.json for this model", "no fast tokenizer")
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    return [
        SimpleToken(id=token_id, text=text[start:stop], start=start, stop=stop)
        for token_id, (start, stop) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
    ]
