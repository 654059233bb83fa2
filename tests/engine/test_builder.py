"""Sizing the KV pool for the asked context, and the start-up errors that name the flags and the bytes."""

from __future__ import annotations

import pytest
import torch

from tgi_llm import LLM
from tgi_llm.engine.builder import DEFAULT_CPU_KV_TOKENS, check_context_fits, kv_cache_budget_bytes
from tgi_llm.engine.limits import LimitOptions
from tgi_llm.engine.options import EngineOptions
from tgi_llm.errors import ArgumentValidationError

PER_TOKEN = 46080  # SmolLM2 in float32
CPU = torch.device("cpu")


def opts(**limits) -> EngineOptions:
    memory = limits.pop("kv_cache_memory_gb", None)
    return EngineOptions(kv_cache_memory_gb=memory, limits=LimitOptions(**limits))


def test_the_cpu_pool_holds_one_request_of_the_asked_context():
    assert kv_cache_budget_bytes(opts(), CPU, PER_TOKEN) == DEFAULT_CPU_KV_TOKENS * PER_TOKEN
    assert kv_cache_budget_bytes(opts(max_total_tokens=32768), CPU, PER_TOKEN) == 32768 * PER_TOKEN
    assert kv_cache_budget_bytes(opts(max_input_tokens=40000), CPU, PER_TOKEN) == 40001 * PER_TOKEN
    assert kv_cache_budget_bytes(opts(max_total_tokens=1000), CPU, PER_TOKEN) == DEFAULT_CPU_KV_TOKENS * PER_TOKEN
    assert kv_cache_budget_bytes(opts(max_total_tokens=32768, kv_cache_memory_gb=0.5), CPU, PER_TOKEN) == 2**29


def test_a_context_over_the_budget_names_the_flags_and_the_bytes():
    with pytest.raises(ArgumentValidationError) as e:
        check_context_fits(opts(max_total_tokens=32768, kv_cache_memory_gb=0.5), 2**29 // PER_TOKEN, PER_TOKEN,
                           torch.float32, None)
    message = str(e.value)
    assert "`max_total_tokens` 32768 needs 1.41 GiB of KV cache (46080 bytes a token in float32)" in message
    assert "the budget holds 11650 tokens (0.50 GiB)" in message
    assert "--kv-cache-memory-gb" in message and "--kv-cache-dtype bfloat16" in message


def test_a_context_over_the_machine_s_memory_names_what_is_available():
    with pytest.raises(ArgumentValidationError, match=r"needs 1\.41 GiB .* the machine has 1\.00 GiB available"):
        check_context_fits(opts(max_total_tokens=32768), 32768, PER_TOKEN, torch.float32, 2**30)
    check_context_fits(opts(max_total_tokens=32768), 32768, PER_TOKEN // 2, torch.bfloat16, 2**30)  # fits


def test_a_pool_sized_in_tokens_is_left_to_tgi_s_checks():
    check_context_fits(opts(max_total_tokens=32768, max_batch_total_tokens=40000), 1, PER_TOKEN, torch.float32, 1)
    check_context_fits(opts(), 1, PER_TOKEN, torch.float32, 1)  # nothing asked: the model's own limit


@pytest.mark.slow
def test_the_default_model_starts_with_a_32k_context_and_refuses_one_that_does_not_fit():
    with LLM(None, max_input_tokens=32000, max_total_tokens=32768, kv_cache_dtype="bfloat16") as llm:
        stats = llm.engine.stats()
        assert stats.kv_blocks_total * llm.engine.limits.block_size >= 32768
        assert llm.engine.limits.max_total_tokens == 32768
    with pytest.raises(ArgumentValidationError, match="`max_total_tokens` 32768 needs 1.41 GiB"):
        LLM(None, max_total_tokens=32768, kv_cache_memory_gb=0.25)
