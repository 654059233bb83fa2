"""Constrained decoding end to end through the engine: every output of 30 prompts x 10 JSON Schemas parses
and validates, greedy and sampled, in a batch of constrained requests and mixed with unconstrained ones
(which keep their tokens); regular expressions match whole; a grammar ends the request."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from tgi_llm import LLM

SCHEMAS = json.loads((Path(__file__).parent / "data" / "json_schemas.json").read_text(encoding="utf-8"))
SUBJECTS = ["a customer", "an order", "the weather in Paris", "a novel", "a concert", "a movie review",
            "two addresses", "sensor data", "a cake", "a web search", "a teacher", "a shipment", "a storm",
            "a poem", "a meetup", "a tweet", "an office", "a lab test", "a salad", "an email", "a pilot",
            "a return", "a heat wave", "a biography", "a webinar", "a complaint", "a warehouse", "a thermometer",
            "a soup", "a calendar invite"]
REGEXES = [r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"(yes|no|maybe)", r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}", r"\+?[0-9]{1,3}"]


def constrained(llm: LLM, schema_names: list[str], sampled: bool) -> tuple[list, list]:
    prompts, params = [], []
    for i, subject in enumerate(SUBJECTS):
        for name in schema_names:
            prompts.append(f"Describe {subject} as JSON:")
            p = {"max_new_tokens": 400, "grammar": {"type": "json", "value": SCHEMAS[name]}}
            if sampled:
                p |= {"do_sample": True, "temperature": 0.9, "seed": i}
            params.append(p)
    return prompts, params


def assert_valid(results, params) -> None:
    for r, p in zip(results, params, strict=True):
        schema = p["grammar"]["value"]
        assert r.finish_reason == "eos_token", (r.finish_reason, r.text)
        jsonschema.validate(json.loads(r.text), schema)


def test_thirty_prompts_times_ten_schemas_validate_greedy_and_sampled_alone_and_mixed(tiny_llama_dir):
    """A random tiny model (the real tokenizer): its own choices are arbitrary, so only the grammar makes
    the outputs valid; fast enough for 600 constrained requests."""
    names = list(SCHEMAS)
    free_prompts = ["Once upon a time", "The weather today", "def main():", "Dear Sir,"]
    free_params = {"max_new_tokens": 24, "ignore_eos": True}
    with LLM(str(tiny_llama_dir), kv_cache_memory_gb=0.3, max_total_tokens=512, max_batch_size=128,
             max_concurrent_requests=400) as llm:
        free_alone = [r.token_ids for r in llm.generate(free_prompts, free_params)]
        prompts, params = constrained(llm, names, sampled=False)
        assert_valid(llm.generate(prompts, params), params)  # constrained requests only
        prompts, params = constrained(llm, names, sampled=True)
        mixed = llm.generate(free_prompts + prompts, [free_params] * len(free_prompts) + params)
        assert_valid(mixed[len(free_prompts):], params)
        assert [r.token_ids for r in mixed[: len(free_prompts)]] == free_alone
        stats = llm.engine.stats()
        assert stats.kv_blocks_free == stats.kv_blocks_total


def test_regular_expressions_match_whole_and_a_grammar_ends_the_request_even_with_ignore_eos(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), kv_cache_memory_gb=0.1, max_total_tokens=256) as llm:
        for regex in REGEXES:
            for ignore_eos in (False, True):
                r = llm.generate(["Answer:"], {"max_new_tokens": 64, "ignore_eos": ignore_eos,
                                               "grammar": {"type": "regex", "value": regex}})[0]
                assert re.fullmatch(regex, r.text), (regex, r.text)
                assert r.finish_reason == "eos_token" and r.generated_tokens < 64


@pytest.mark.slow
def test_the_real_model_fills_each_schema_sensibly_greedy_and_sampled(default_model_dir):
    with LLM(None, kv_cache_memory_gb=0.3) as llm:
        tok = llm.tokenizer
        prompts, params = [], []
        for sampled in (False, True):
            for name, schema in SCHEMAS.items():
                message = [{"role": "user", "content": f"Give me an example of a {name} as JSON."}]
                prompts.append(tok.apply_chat_template(message, tokenize=False, add_generation_prompt=True))
                p = {"max_new_tokens": 300, "grammar": {"type": "json", "value": schema}}
                params.append(p | ({"do_sample": True, "seed": 5, "temperature": 0.7} if sampled else {}))
        assert_valid(llm.generate(prompts, params), params)
