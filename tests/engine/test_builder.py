"""Sizing the KV pool for the asked context, the start-up errors that name the flags and the bytes, and the
context the rope flags allow."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import TOKENIZER_FILES
from tgi_llm import LLM
from tgi_llm.engine.builder import DEFAULT_CPU_KV_TOKENS, check_context_fits, kv_cache_budget_bytes
from tgi_llm.engine.limits import LimitOptions, default_step_tokens, resolve_limits, resolve_max_total_tokens
from tgi_llm.engine.options import EngineOptions
from tgi_llm.errors import ArgumentValidationError, ValidationError

PER_TOKEN = 46080  # SmolLM2 in float32
CPU = torch.device("cpu")


def opts(**limits) -> EngineOptions:
    memory = limits.pop("kv_cache_memory_gb", None)
    return EngineOptions(kv_cache_memory_gb=memory, limits=LimitOptions(**limits))


def test_the_cpu_pool_holds_one_request_of_the_asked_context_in_whole_blocks():
    assert kv_cache_budget_bytes(opts(), CPU, PER_TOKEN, 4096, 16) == DEFAULT_CPU_KV_TOKENS * PER_TOKEN
    assert kv_cache_budget_bytes(opts(), CPU, PER_TOKEN, 32768, 16) == 32768 * PER_TOKEN
    assert kv_cache_budget_bytes(opts(), CPU, PER_TOKEN, 40001, 16) == 40016 * PER_TOKEN
    assert kv_cache_budget_bytes(opts(kv_cache_memory_gb=0.5), CPU, PER_TOKEN, 32768, 16) == 2**29


def test_a_prompt_limit_alone_past_the_default_pool_resolves_against_the_pool_made_for_it():
    """--max-input-tokens 40000 alone: a request of 40,001 tokens, in a pool of whole blocks that holds it."""
    asked = LimitOptions(max_input_tokens=40000)
    context = resolve_max_total_tokens(asked, 8192)
    pool = kv_cache_budget_bytes(EngineOptions(limits=asked), CPU, PER_TOKEN, context, 16) // PER_TOKEN
    limits = resolve_limits(asked, 8192, pool, default_step_tokens("cpu"))
    assert (limits.max_total_tokens, limits.max_batch_total_tokens) == (40001, 40016)


def test_a_context_over_the_budget_names_the_flags_and_the_bytes():
    with pytest.raises(ArgumentValidationError) as e:
        check_context_fits(opts(max_total_tokens=32768, kv_cache_memory_gb=0.5), 32768, 2**29 // PER_TOKEN,
                           PER_TOKEN, torch.float32, None)
    message = str(e.value)
    assert "`max_total_tokens` 32768 needs 1.41 GiB of KV cache (46080 bytes a token in float32)" in message
    assert "the budget holds 11650 tokens (0.50 GiB)" in message
    assert "--kv-cache-memory-gb" in message and "--kv-cache-dtype float16" in message


def test_the_default_context_over_the_budget_names_the_bytes_too():
    with pytest.raises(ArgumentValidationError, match=r"Not enough KV-cache memory: `max_total_tokens` 4096 needs "
                                                      r"0\.18 GiB .* the budget holds 2320 tokens \(0\.10 GiB\)"):
        check_context_fits(opts(kv_cache_memory_gb=0.1), 4096, 2320, PER_TOKEN, torch.float32, None)


def test_a_context_over_the_machine_s_memory_names_what_is_available():
    with pytest.raises(ArgumentValidationError, match=r"needs 1\.41 GiB .* the machine has 1\.00 GiB available"):
        check_context_fits(opts(max_total_tokens=32768), 32768, 32768, PER_TOKEN, torch.float32, 2**30)
    check_context_fits(opts(max_total_tokens=32768), 32768, 32768, PER_TOKEN // 2, torch.bfloat16, 2**30)  # fits


def test_the_kv_cache_may_take_80_percent_of_the_available_memory_every_shard_together():
    with pytest.raises(ArgumentValidationError, match=r"1\.60 GiB available, of which the KV cache may take 80%"):
        check_context_fits(opts(), 32768, 32768, PER_TOKEN, torch.float32, int(1.6 * 2**30))  # 1.41 > 1.28
    check_context_fits(opts(), 32768, 32768, PER_TOKEN, torch.float32, int(1.8 * 2**30))  # 1.41 <= 1.44
    two = EngineOptions(num_shard=2)  # each rank caches half the KV heads, on the same machine
    with pytest.raises(ArgumentValidationError, match=r"needs 0\.70 GiB .* on each of 2 shards"):
        check_context_fits(two, 32768, 32768, PER_TOKEN // 2, torch.float32, int(1.6 * 2**30))


def test_a_pool_sized_in_tokens_is_left_to_tgi_s_checks():
    check_context_fits(opts(max_total_tokens=32768, max_batch_total_tokens=40000), 32768, 1, PER_TOKEN,
                       torch.float32, 1)


@pytest.mark.slow
def test_the_default_model_starts_with_a_32k_context_and_refuses_one_that_does_not_fit():
    with LLM(None, max_input_tokens=32000, max_total_tokens=32768, kv_cache_dtype="bfloat16") as llm:
        stats = llm.engine.stats()
        assert stats.kv_blocks_total * llm.engine.limits.block_size >= 32768
        assert llm.engine.limits.max_total_tokens == 32768
    with pytest.raises(ArgumentValidationError, match="`max_total_tokens` 32768 needs 1.41 GiB"):
        LLM(None, max_total_tokens=32768, kv_cache_memory_gb=0.25)


def test_a_gpu_kv_cache_of_another_type_than_the_model_is_refused_at_start_up_where_flash_attn_runs(monkeypatch):
    """flash-attn reads a cache of the queries' dtype only: refused naming both flags, before any weights load
    (the model id names nothing), only where flash-attn would run."""
    import tgi_llm.attention.flash
    from tgi_llm.engine.builder import build_engine, check_kv_dtype_fits_backend

    monkeypatch.setattr(tgi_llm.attention.flash, "flash_attn_available", lambda: True)
    with pytest.raises(ArgumentValidationError, match=r"`--kv-cache-dtype float16` differs from `--dtype bfloat16`"
                                                      r".*`--kv-cache-dtype auto`, or `--dtype float16` for both"):
        build_engine(EngineOptions(model_id="/nonexistent", device="cuda", kv_cache_dtype="float16"))
    gpu = torch.device("cuda")
    check_kv_dtype_fits_backend(gpu, torch.bfloat16, torch.bfloat16)
    check_kv_dtype_fits_backend(CPU, torch.float32, torch.bfloat16)
    monkeypatch.setattr(tgi_llm.attention.flash, "flash_attn_available", lambda: False)  # the torch backend serves it
    check_kv_dtype_fits_backend(gpu, torch.bfloat16, torch.float32)


@pytest.fixture(scope="module")
def short_context_dir(tiny_model_factory, default_model_dir, tmp_path_factory) -> Path:
    """A random tiny Llama trained (nominally) for 256 positions, with the default model's tokenizer."""
    path = tmp_path_factory.mktemp("tiny-256") / "model"
    shutil.copytree(tiny_model_factory(vocab_size=49152, max_position_embeddings=256), path)
    for name in TOKENIZER_FILES:
        if (default_model_dir / name).is_file():
            shutil.copy(default_model_dir / name, path / name)
    return path


def rope_scaled_greedy(model_dir: Path, prompt: list[int], new_tokens: int, scaling: str, factor: float) -> list[int]:
    """transformers' greedy generate with the config's rope scaling set as the flags set ours."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    config.rope_parameters = {**config.rope_parameters, "rope_type": scaling, "factor": factor}
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
    with torch.no_grad():
        x = torch.tensor([prompt])
        return model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                              do_sample=False)[0, len(prompt):].tolist()


@pytest.mark.parametrize("scaling", ["linear", "dynamic"])
def test_a_rope_factor_serves_a_prompt_past_max_position_embeddings_as_transformers_does(short_context_dir, scaling):
    """256 positions x --rope-factor 4: the default context is 1,024 tokens and a 900-token prompt is served, with
    transformers' tokens for the same scaling; without the flags the same prompt is refused. In one prefill step,
    as transformers runs it: dynamic scaling rotates each step's tokens by the sequence's length so far, so a
    prompt split into chunks has its first chunk's keys rotated with a smaller base (TGI's too)."""
    prompt = torch.randint(100, 49000, (900,), generator=torch.Generator().manual_seed(0)).tolist()
    params = {"max_new_tokens": 12, "ignore_eos": True}
    with LLM(str(short_context_dir), rope_scaling=scaling, rope_factor=4.0, max_batch_prefill_tokens=1024) as llm:
        assert (llm.engine.limits.max_input_tokens, llm.engine.limits.max_total_tokens) == (1023, 1024)
        got = llm.generate([prompt], params)[0].final.token_ids
    assert got == rope_scaled_greedy(short_context_dir, prompt, 12, scaling, 4.0)
    with LLM(str(short_context_dir)) as llm, pytest.raises(ValidationError, match="less than 255 tokens"):
        llm.generate([prompt], params)


def test_a_context_the_machine_cannot_hold_fails_at_start_up_naming_the_flags_and_the_bytes(short_context_dir,
                                                                                             monkeypatch):
    import tgi_llm.memory

    monkeypatch.setattr(tgi_llm.memory, "available_bytes", lambda: 100_000)  # MemAvailable: 0.4 MB
    with pytest.raises(ArgumentValidationError) as e:
        LLM(str(short_context_dir), rope_factor=4.0, max_total_tokens=1024)
    message = str(e.value)
    assert "Not enough memory: `max_total_tokens` 1024 needs" in message  # 1,024 x 512 bytes: 0.5 MiB
    assert "(512 bytes a token in float32)" in message and "--max-total-tokens" in message
    assert "--kv-cache-dtype" in message

