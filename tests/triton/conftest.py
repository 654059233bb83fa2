"""Adapter tests run the real engine loop with the engine tests' scripted runner and tokenizer."""

from tests.engine.conftest import tokenizer  # noqa: F401  (session fixture, reused)
