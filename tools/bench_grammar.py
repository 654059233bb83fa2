#!/usr/bin/env python3
"""Grammar engines for constrained decoding, measured the way the server uses one: compile a JSON Schema
per request, then at every decode step compute the allowed-token mask of each of a batch of requests
(each with its own schema) and advance each by one token.

    .venv/bin/python tools/bench_grammar.py --batch 32 --steps 64

Reports, per library installed (llguidance, xgrammar, outlines-core): compile time per schema, mask time
per step for the whole batch and per token, and which schemas of tests/data/json_schemas.json (plus a few
harder JSON Schema features) each one accepts. Tokens are drawn at random among the allowed ones (seeded),
so every library walks comparable paths; no model runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: JSON Schema features beyond the test set, to see what each library covers.
EXTRA_SCHEMAS = {
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 5}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}]},
    "format-date-time": {"type": "string", "format": "date-time"},
    "recursive": {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v"]}}, "$ref": "#/$defs/node"},
    "patternProperties": {"type": "object", "patternProperties": {"^x-[a-z]+$": {"type": "integer"}}},
    "multipleOf": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 3},
}


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.ll, self.llt = llguidance, llguidance.torch
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
        self.executor = llguidance.LLExecutor()
        self.vocab = vocab

    def compile(self, schema: str):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema)
        matcher = self.ll.LLMatcher(self.tok, grammar)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def matcher(self, compiled):
        return compiled.deep_copy()

    def allocate(self, batch: int) -> torch.Tensor:
        return self.llt.allocate_token_bitmask(batch, self.vocab)

    def fill(self, matchers, bitmask: torch.Tensor) -> None:
        self.llt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def advance(self, matcher, token: int) -> bool:
        matcher.consume_token(token)
        return matcher.is_stopped() or matcher.is_error()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        self.compiler = xgr.GrammarCompiler(info)
        self.vocab = vocab

    def compile(self, schema: str):
        return self.compiler.compile_json_schema(schema)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def allocate(self, batch: int) -> torch.Tensor:
        return self.xgr.allocate_token_bitmask(batch, self.vocab)

    def fill(self, matchers, bitmask: torch.Tensor) -> None:
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(bitmask, i)

    def advance(self, matcher, token: int) -> bool:
        matcher.accept_token(token)
        return matcher.is_terminated()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer, vocab: int) -> None:
        from outlines_core import Vocabulary

        self.vocab = vocab
        eos = tokenizer.eos_token_id
        tokens: dict[str, list[int]] = {}
        for token, i in tokenizer.get_vocab().items():
            if i != eos and i < vocab:
                tokens.setdefault(tokenizer.convert_tokens_to_string([token]), []).append(i)
        self.vocabulary = Vocabulary(eos, tokens)

    def compile(self, schema: str):
        from outlines_core import Index, json_schema

        return Index(json_schema.build_regex_from_schema(schema), self.vocabulary)

    def matcher(self, compiled):
        from outlines_core import Guide

        return Guide(compiled)

    def allocate(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, (self.vocab + 31) // 32, dtype=torch.int32)

    def fill(self, matchers, bitmask: torch.Tensor) -> None:
        bitmask.zero_()
        for i, g in enumerate(matchers):
            row = bitmask[i]
            g.write_mask_into(row.data_ptr(), row.numel(), row.element_size())

    def advance(self, matcher, token: int) -> bool:
        matcher.advance(token)
        return matcher.is_finished()


def allowed(bitmask_row: torch.Tensor, vocab: int) -> np.ndarray:
    bits = np.unpackbits(bitmask_row.numpy().view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)


def measure(lib, schemas: dict[str, dict], batch: int, steps: int, seed: int) -> dict:
    compiled, compile_ms, failed = {}, {}, {}
    for name, schema in schemas.items():
        t0 = time.perf_counter()
        try:
            compiled[name] = lib.compile(json.dumps(schema))
            compile_ms[name] = (time.perf_counter() - t0) * 1e3
        except Exception as exc:  # a feature the library does not support
            failed[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
    names = [n for n in schemas if n in compiled]
    rng = random.Random(seed)
    rows = [names[i % len(names)] for i in range(batch)]
    matchers = [lib.matcher(compiled[n]) for n in rows]
    bitmask = lib.allocate(batch)
    fill_s = []
    for _ in range(steps):
        t0 = time.perf_counter()
        lib.fill(matchers, bitmask)
        fill_s.append(time.perf_counter() - t0)
        for i, m in enumerate(matchers):
            choices = allowed(bitmask[i], lib.vocab)
            if len(choices) == 0 or lib.advance(m, int(rng.choice(list(choices)))):
                matchers[i] = lib.matcher(compiled[rows[i]])  # finished: a new request takes the slot
    return {"compile_ms": compile_ms, "failed": failed, "fill_ms_p50": statistics.median(fill_s) * 1e3,
            "fill_ms_mean": statistics.fmean(fill_s) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-id", default=None)
    args = ap.parse_args()
    from transformers import AutoConfig, AutoTokenizer

    from tgi_llm.weights import resolve_model_dir

    model_dir = resolve_model_dir(args.model_id)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    schemas = json.loads((ROOT / "tests" / "data" / "json_schemas.json").read_text(encoding="utf-8"))
    schemas |= EXTRA_SCHEMAS
    torch.set_num_threads(1)
    print(f"| library | schemas compiled / {len(schemas)} | compile ms p50 (max) | mask ms per step, batch "
          f"{args.batch}, p50 | per token us | not supported |")
    print("|---|---|---|---|---|---|")
    for cls in (Llguidance, Xgrammar, OutlinesCore):
        try:
            lib = cls(tokenizer, vocab)
        except ImportError as exc:
            print(f"| {cls.name} | not installed ({exc}) | | | | |")
            continue
        r = measure(lib, schemas, args.batch, args.steps, args.seed)
        times = sorted(r["compile_ms"].values())
        print(f"| {cls.name} | {len(r['compile_ms'])} | {statistics.median(times):.1f} ({times[-1]:.0f}) "
              f"| {r['fill_ms_p50']:.2f} | {r['fill_ms_p50'] * 1e3 / args.batch:.0f} "
              f"| {', '.join(sorted(r['failed'])) or '-'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
