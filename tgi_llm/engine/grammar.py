"""Grammars for constrained decoding: the request shapes users send, turned into one canonical spec, and
compiled once per content with llguidance.

Why llguidance (tools/bench_grammar.py, the 10 test schemas plus 7 harder JSON Schema features, batch 32,
AMD EPYC Zen 3, 2 vCPUs): it compiles a schema in ~1 ms (xgrammar ~20 ms, up to 1.2 s; outlines-core
~1.8 s, up to 44 s), so compiling at validation costs nothing; its mask for a batch of 32 different
schemas takes ~1.6 ms per step (xgrammar ~1.1 ms, outlines-core ~1.1 ms), under 2% of a CPU decode step
either way; it rejects what it does not support (uniqueItems) where xgrammar silently approximates
(oneOf, allOf); and it is one small wheel with no dependencies (xgrammar pulls triton and tvm-ffi). It
also gives regular expressions and context-free grammars (Lark, GBNF) for free.

Kinds: "json_schema" (the value is a schema; `{"type": "object"}` is "any JSON object"), "regex",
"lark" (a context-free grammar; GBNF is converted).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tgi_llm.errors import ValidationError

logger = logging.getLogger(__name__)

KINDS = ("json_schema", "regex", "lark")
#: Every name a client may use for a kind: TGI's (`json`, `regex`), OpenAI's response_format types, and the
#: `guided_decoding_guide_type` values of Triton's OpenAI front end and TensorRT-LLM.
ALIASES = {
    "json": "json_schema", "json_schema": "json_schema", "json_object": "json_schema",
    "regex": "regex", "lark": "lark", "ebnf": "lark", "ebnf_grammar": "lark", "gbnf": "lark", "grammar": "lark",
}
ANY_JSON_OBJECT = '{"type": "object"}'
#: JSON is generated compactly (no free whitespace): fewer tokens, and a shape tool-call parsing relies on.
_JSON_DEFAULTS = {"whitespace_flexible": False}


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # one of KINDS
    value: str  # the schema (canonical JSON text), the regex, or the Lark grammar

    @classmethod
    def parse(cls, raw: Any, field_name: str = "grammar") -> GrammarSpec:
        """TGI's `{"type": "json" | "regex" | "json_object", "value": ...}` (also as a JSON string: Triton
        request parameters are strings). A JSON Schema value may be an object or its text."""
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError:
                raise ValidationError(f"`{field_name}` must be an object with `type` and `value`") from None
        if not isinstance(raw, dict) or "type" not in raw:
            raise ValidationError(f"`{field_name}` must be an object with `type` and `value`. Given: {raw!r:.200}")
        kind = ALIASES.get(str(raw["type"]).lower())
        if kind is None:
            raise ValidationError(f"`{field_name}.type` must be one of json, regex, json_object, lark. "
                                  f"Given: {raw['type']!r:.50}")
        value = raw.get("value")
        if kind == "json_schema":
            if raw["type"] == "json_object" or value is None:
                return cls(kind, ANY_JSON_OBJECT)
            return cls(kind, canonical_schema(value, f"{field_name}.value"))
        if not isinstance(value, str) or not value:
            raise ValidationError(f"`{field_name}.value` must be a non-empty string for type {raw['type']}")
        return cls(kind, value)

    @classmethod
    def json_schema(cls, schema: Any, field_name: str = "grammar") -> GrammarSpec:
        return cls("json_schema", canonical_schema(schema, field_name))


def canonical_schema(schema: Any, field_name: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"`{field_name}` is not valid JSON: {exc}") from None
    if not isinstance(schema, dict | bool):
        raise ValidationError(f"`{field_name}` must be a JSON Schema object. Given: {schema!r:.200}")
    # Key order matters to JSON Schema only for `properties` (the order fields are generated in), and
    # json.dumps keeps it: the text is the cache key as the client wrote it.
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


@dataclass
class GrammarStats:
    """Running totals for the metrics port."""

    compiled: int = 0
    cache_hits: int = 0
    compile_s: float = 0.0


class CompiledGrammar:
    """A grammar compiled for one tokenizer; `matcher()` gives a fresh matcher state for one request."""

    def __init__(self, spec: GrammarSpec, pristine: Any) -> None:
        self.spec = spec
        self._pristine = pristine

    def matcher(self) -> Any:
        return self._pristine.deep_copy()


class GrammarCompiler:
    """Compiles grammars for the model's tokenizer, least recently used first out of a bounded cache.
    Thread-safe: validation runs on the server's request threads."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int], cache_size: int = 256) -> None:
        self._hf_tokenizer, self._vocab_size = tokenizer, vocab_size
        self._eos = sorted(eos_token_ids)
        self._ll_tokenizer: Any = None
        self._cache: OrderedDict[GrammarSpec, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.stats = GrammarStats()

    def _tokenizer(self) -> Any:
        if self._ll_tokenizer is None:  # built on first use: ~0.5 s for a 49k vocabulary
            import llguidance.hf

            self._ll_tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size,
                                                              eos_token=self._eos or None)
        return self._ll_tokenizer

    def compile(self, spec: GrammarSpec, field_name: str = "grammar") -> CompiledGrammar:
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                self.stats.cache_hits += 1
                return hit
            tokenizer = self._tokenizer()
        compiled = self._compile(spec, tokenizer, field_name)
        with self._lock:
            self._cache[spec] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: GrammarSpec, tokenizer: Any, field_name: str) -> CompiledGrammar:
        import llguidance

        t0 = time.perf_counter()
        try:
            if spec.kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(spec.value, defaults=_JSON_DEFAULTS)
            elif spec.kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(spec.value)
            else:
                grammar = llguidance.grammar_from("grammar", spec.value)
        except Exception as exc:  # the library's parse errors: the client's grammar is wrong
            raise ValidationError(f"`{field_name}` cannot be compiled: {error_line(exc)}") from None
        error = llguidance.LLMatcher.validate_grammar(grammar)
        if error:
            raise ValidationError(f"`{field_name}` cannot be compiled: {error_line(error)}")
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        if matcher.is_error():
            raise ValidationError(f"`{field_name}` cannot be compiled: {error_line(matcher.get_error())}")
        # Some grammars fail only once a mask is asked for (a schema that only refers to itself matches
        # nothing): asked here on a copy, they are refused up front instead of failing while generating.
        probe = matcher.deep_copy()
        probe.compute_bitmask()
        if probe.is_error():
            raise ValidationError(f"`{field_name}` cannot be followed: {error_line(probe.get_error())}")
        elapsed = time.perf_counter() - t0
        with self._lock:
            self.stats.compiled += 1
            self.stats.compile_s += elapsed
        logger.debug("compiled a %s grammar in %.1f ms", spec.kind, elapsed * 1e3)
        return CompiledGrammar(spec, matcher)


def error_line(error: Any, limit: int = 300) -> str:
    """llguidance's errors carry the parser's whole state (the grammar included): the first line, bounded."""
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else "unknown error"
