"""Build a ready engine from options: resolve weights, load model and tokenizer, size the KV cache."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tgi_llm.engine.engine import Engine
from tgi_llm.engine.limits import (
    Limits,
    check_static_limits,
    default_step_target_ms,
    default_step_tokens,
    resolve_limits,
    resolve_max_total_tokens,
)
from tgi_llm.engine.options import EngineOptions
from tgi_llm.errors import ArgumentValidationError
from tgi_llm.kv_cache import kv_cache_dtype_name

if TYPE_CHECKING:
    from tgi_llm.engine.kv_event_publisher import ZmqKVEventPublisher

logger = logging.getLogger(__name__)

#: KV-cache tokens on the CPU when neither --max-batch-total-tokens nor --kv-cache-memory-gb is given (was a
#: fixed 2 GiB): four requests of the default 4,096-token limit, or 16 of 1,024 (755 MB for the default model
#: in float32). Memory is backed only as blocks are used (kv_cache.py).
DEFAULT_CPU_KV_TOKENS = 16384
#: On CUDA, the share of free memory (after the weights) given to the KV cache, as TGI's
#: `--cuda-memory-fraction` leaves room for activations.
CUDA_KV_CACHE_FRACTION = 0.8
#: On the CPU, the most of MemAvailable (read after the weights load) one request's KV cache may need: the rest
#: for activations, the tokenizer and the page cache.
CPU_KV_MEMORY_FRACTION = 0.8


def resolve_device_and_dtype(opts: EngineOptions) -> tuple[torch.device, torch.dtype]:
    device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    name = opts.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    return device, getattr(torch, name)


def eos_token_ids(model_dir: Path, tokenizer) -> set[int]:
    """Every EOS id the generation config names, plus the tokenizer's own."""
    ids: set[int] = set()
    path = model_dir / "generation_config.json"
    if path.exists():
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def kv_cache_budget_bytes(opts: EngineOptions, device: torch.device, per_token: int, context: int,
                          block_size: int) -> int:
    """What the pool may hold when --max-batch-total-tokens is not given (when it is, it sizes the pool).
    On the CPU: DEFAULT_CPU_KV_TOKENS, or one request of `context` (the max_total_tokens the limits resolve
    to) in whole blocks where that is longer."""
    if opts.kv_cache_memory_gb is not None:
        return int(opts.kv_cache_memory_gb * 2**30)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * CUDA_KV_CACHE_FRACTION)
    return -(-max(DEFAULT_CPU_KV_TOKENS, context) // block_size) * block_size * per_token


def check_context_fits(opts: EngineOptions, asked: int, kv_tokens: int, per_token: int, kv_dtype: torch.dtype,
                       available: int | None) -> None:
    """Fail at start-up, naming the flags and the bytes, when one request of `asked` tokens (the resolved
    max_total_tokens) cannot fit: not in the pool of `kv_tokens`, or (`available`: MemAvailable, None:
    unknown) not in CPU_KV_MEMORY_FRACTION of the machine's memory, every shard's slice together."""
    if opts.limits.max_batch_total_tokens is not None:
        return  # TGI's token checks (resolve_limits) cover a pool sized in tokens
    need = asked * per_token
    what = (f"`max_total_tokens` {asked} needs {need / 2**30:.2f} GiB of KV cache ({per_token} bytes a token in "
            f"{kv_cache_dtype_name(kv_dtype)})")
    remedies = ("lower `--max-total-tokens`, or store the cache in fewer bits (`--kv-cache-dtype float16`: half of "
                "float32's bytes; `int8`: 28%)")
    if asked > kv_tokens:
        raise ArgumentValidationError(
            f"Not enough KV-cache memory: {what}, but the budget holds {kv_tokens} tokens "
            f"({kv_tokens * per_token / 2**30:.2f} GiB); raise `--kv-cache-memory-gb`, {remedies}")
    if available is not None and need * opts.num_shard > available * CPU_KV_MEMORY_FRACTION:
        shards = f" on each of {opts.num_shard} shards" if opts.num_shard > 1 else ""
        raise ArgumentValidationError(
            f"Not enough memory: {what}{shards}, but the machine has {available / 2**30:.2f} GiB available, of "
            f"which the KV cache may take {CPU_KV_MEMORY_FRACTION:.0%}; {remedies}")


def build_engine(opts: EngineOptions) -> Engine:
    """Load on a thread that ends before the engine's starts: its OpenMP pool must not outlive the load
    (tgi_llm/openmp.py)."""
    from tgi_llm.openmp import on_passing_thread

    return on_passing_thread(lambda: _build_engine(opts))


def _build_engine(opts: EngineOptions) -> Engine:
    # Imported here so that `tgi_llm.engine` stays importable (and testable) without a model.
    from transformers import AutoTokenizer

    from tgi_llm.attention import preferred_block_size
    from tgi_llm.kv_cache import allocate_kv_cache, resolve_kv_cache_dtype
    from tgi_llm.models.config import attention_cost_per_context_token, kv_cache_bytes_per_token
    from tgi_llm.models.loader import load_model
    from tgi_llm.quant.modes import parse_quantize
    from tgi_llm.runner.model_runner import ModelRunner
    from tgi_llm.weights import resolve_model_dir
    from tgi_llm.weights.safetensors_loader import NO_SHARD

    check_static_limits(opts.limits)  # fail before spending time on weights
    quantization = parse_quantize(opts.quantize, opts.quantize_group_size)
    device, dtype = resolve_device_and_dtype(opts)
    kv_dtype = resolve_kv_cache_dtype(opts.kv_cache_dtype, dtype)
    check_kv_dtype_fits_backend(device, dtype, kv_dtype)  # before shards spawn and weights load
    if device.type == "cpu" and os.environ.get("OMP_NUM_THREADS") is None:
        torch.set_num_threads(os.cpu_count() or 1)
    model_dir = resolve_model_dir(opts.model_id)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lora_slots = lora_geometry(opts)  # before shards spawn: they allocate them too
    shards = None
    if opts.num_shard > 1:  # MPI is imported on this path only: one shard runs in-process
        from tgi_llm.parallel import ShardGroup

        shards = ShardGroup.launch(opts.num_shard, model_dir, dtype, device, opts.model_id or _default_model_id(),
                                   opts.quantize, opts.quantize_group_size, kv_cache_dtype_name(kv_dtype),
                                   opts.rope_override, *(lora_slots or (0, 0)), shard_hosts=opts.shard_hosts,
                                   master_addr=opts.shard_master_addr)
    model, config = load_model(model_dir, dtype=dtype, device=device, shard=shards.shard if shards else NO_SHARD,
                               quantization=quantization, rope_override=opts.rope_override)
    block_size = opts.limits.block_size
    if block_size == 16 and preferred_block_size(device) != 16:
        block_size = preferred_block_size(device)
        logger.info("KV block size %d (what the attention backend needs on %s)", block_size, device)
    dtype = model.dtype  # what the layers compute in (bfloat16 on the CPU: float32 with bfloat16 weights)
    # before the first forward: the fused stack reads the slots
    lora = lora_registry(opts, model, config, device, lora_slots, shards.shard if shards else None)
    per_token = kv_cache_bytes_per_token(config, kv_dtype) // opts.num_shard  # a rank caches 1/N of the KV heads
    rope = opts.rope_override
    context = rope.context(config.max_position_embeddings) if rope else config.max_position_embeddings
    asked = resolve_max_total_tokens(opts.limits, context)
    kv_tokens = kv_cache_budget_bytes(opts, device, per_token, asked, block_size) // per_token
    kv_tokens -= kv_tokens % block_size  # the pool holds whole blocks
    from tgi_llm.memory import available_bytes

    check_context_fits(opts, asked, kv_tokens, per_token, kv_dtype,
                       available_bytes() if device.type == "cpu" else None)
    from dataclasses import replace

    limit_opts = replace(opts.limits, block_size=block_size)
    if opts.speculative_model and not limit_opts.speculate:  # a draft model is there to guess
        from tgi_llm.speculation.policy import SERVED_SPECULATE

        limit_opts = replace(limit_opts, speculate=SERVED_SPECULATE)
    limits = resolve_limits(limit_opts, context, kv_tokens, default_step_tokens(device.type),
                            default_step_target_ms(device.type))
    kv_caches = allocate_kv_cache(shards.cache_config(config) if shards else config, limits.num_blocks, block_size,
                                  kv_dtype, device)
    logger.info(
        "KV cache: %d blocks of %d tokens in %s (%.2f GiB, %d bytes/token); prefix caching %s, chunked prefill %s "
        "(step budget %d tokens, paced to %s ms while streams decode)", limits.num_blocks, block_size,
        kv_cache_dtype_name(kv_dtype), limits.num_blocks * block_size * per_token / 2**30, per_token,
        "on" if limits.prefix_caching else "off",
        "on" if limits.prefill_chunking else "off", limits.max_batch_prefill_tokens,
        limits.prefill_step_target_ms or "-",
    )
    eos = eos_token_ids(model_dir, tokenizer)
    if shards is None:
        runner = ModelRunner(model, kv_caches, block_size, config.vocab_size, device, frozenset(eos))
        runner.warm_up()
    else:  # returns once every shard is ready to run steps
        from tgi_llm.parallel import ShardedModelRunner

        runner = ShardedModelRunner(shards, model, kv_caches, block_size, config.vocab_size, device, frozenset(eos))
    proposer = None
    if opts.speculative_model:
        proposer = _draft_model_proposer(opts.speculative_model, tokenizer, config.vocab_size, limits, dtype, device,
                                         kv_dtype)
    engine = Engine(tokenizer, limits, runner, eos,
                    model_id=opts.model_id or _default_model_id(), vocab_size=config.vocab_size, proposer=proposer,
                    lora=lora, kv_events=kv_event_publisher(opts, limits),
                    kv_medium="GPU" if device.type == "cuda" else "CPU")
    engine.scheduler.pacer.context_weight = attention_cost_per_context_token(config)
    from tgi_llm.memory import account, libc_trim

    # Loading freed what it made on the way (float copies a quantized model was made from, a GGUF's
    # dequantized tensors: ~1.4 GB for SmolLM2 with --quantize int8) into glibc's heap, which keeps it
    # resident until trimmed: give it back before the first request, not after the first burst.
    if device.type == "cpu" and (trim := libc_trim()) is not None:
        trim()
    engine.memory_account = lambda: account(model, kv_caches)  # rank 0's process; ranks log their own
    logger.info("memory: %s", engine.memory_account().describe())
    if shards is not None:  # a shard dying while no step runs marks the engine unhealthy too
        shards.on_failure(lambda _reason: setattr(engine, "healthy", False))
    return engine


def kv_event_publisher(opts: EngineOptions, limits: Limits) -> ZmqKVEventPublisher | None:
    """--kv-events-endpoint's publisher; ZMQ is imported only when it is set."""
    if not opts.kv_events_endpoint:
        return None
    if not limits.prefix_caching:
        logger.warning("--kv-events-endpoint with prefix caching off: no block is ever stored, so none is announced")
    import zmq

    from tgi_llm.engine.kv_event_publisher import ZmqKVEventPublisher

    try:
        return ZmqKVEventPublisher(opts.kv_events_endpoint, opts.kv_events_replay_endpoint, opts.kv_events_topic)
    except zmq.ZMQError as exc:
        raise ArgumentValidationError(f"`kv_events_endpoint` {opts.kv_events_endpoint!r} / "
                                      f"`kv_events_replay_endpoint` {opts.kv_events_replay_endpoint!r}: {exc}") from exc


def lora_geometry(opts: EngineOptions) -> tuple[int, int] | None:
    """(slots, rank) of the LoRA slots every rank allocates, or None without LoRA: --max-loras (default: as many as
    --lora-adapters names, at least 1) and --max-lora-rank (default: the largest start-up adapter's rank, and at
    least 16 with runtime loading). A start-up adapter that cannot run on this model stops the start, naming it."""
    from tgi_llm.lora.peft_adapter import AdapterError, adapter_rank
    from tgi_llm.lora.spec import parse_lora_adapters

    adapters = parse_lora_adapters(opts.lora_adapters)
    if not adapters and not opts.lora_runtime_loading:
        return None
    max_rank = opts.max_lora_rank
    if max_rank is None:
        ranks = [16] if opts.lora_runtime_loading or not adapters else []
        for name, path in adapters.items():
            try:
                ranks.append(adapter_rank(path))
            except AdapterError as exc:
                raise ArgumentValidationError(f"`lora_adapters` {name}: {exc}") from None
        max_rank = max(ranks)
    return opts.max_loras or max(len(adapters), 1), max_rank


def lora_registry(opts: EngineOptions, model, config, device: torch.device, geometry: tuple[int, int] | None,
                  shard=None):
    """The LoRA slots on the model (this rank's slice) and the registry of adapters, --lora-adapters' registered
    (None: no LoRA)."""
    from tgi_llm.lora.peft_adapter import AdapterError
    from tgi_llm.lora.registry import LoraRegistry
    from tgi_llm.lora.spec import parse_lora_adapters
    from tgi_llm.lora.weights import ModelLora
    from tgi_llm.weights.safetensors_loader import NO_SHARD

    if geometry is None:
        return None
    adapters = parse_lora_adapters(opts.lora_adapters)
    slots = ModelLora.allocate(config, *geometry, device, torch.float32 if device.type == "cpu" else model.dtype,
                               shard or NO_SHARD, model.lora_targets())
    model.attach_lora(slots)
    registry = LoraRegistry(slots.slots, slots.max_rank, slots.read, opts.lora_runtime_loading)
    for name, path in adapters.items():
        try:
            registry.register(name, str(Path(path).resolve()))
        except (AdapterError, KeyError) as exc:
            raise ArgumentValidationError(f"`lora_adapters` {name}: {exc}") from None
    logger.info("LoRA: %d adapters registered (%s), %d resident at once, rank up to %d, %.1f MB of slots%s",
                len(adapters), ", ".join(adapters) or "none", slots.slots, slots.max_rank, slots.nbytes / 1e6,
                "; runtime loading on" if opts.lora_runtime_loading else "")
    return registry


def check_kv_dtype_fits_backend(device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype) -> None:
    """flash-attn, which a GPU takes where it is installed, reads a cache of the queries' dtype only. Refused
    rather than served by the torch backend, which gathers every sequence's K/V each step (many times slower
    on a GPU): one type for both (--dtype) keeps flash-attn's speed."""
    from tgi_llm.attention.flash import flash_attn_available

    if device.type == "cuda" and kv_dtype != dtype and flash_attn_available():
        kv, model = kv_cache_dtype_name(kv_dtype), str(dtype).removeprefix("torch.")
        raise ArgumentValidationError(
            f"`--kv-cache-dtype {kv}` differs from `--dtype {model}`, and flash-attn reads a KV cache of the "
            f"model's dtype only: use `--kv-cache-dtype auto`, or `--dtype {kv}` for both")


def _draft_model_proposer(model_id: str, tokenizer, vocab_size: int, limits, dtype: torch.dtype,
                          device: torch.device, kv_dtype: torch.dtype):
    """The draft model for --speculative-model, with a KV pool laid out like the target's, of the same type."""
    from transformers import AutoTokenizer

    from tgi_llm.kv_cache import allocate_kv_cache
    from tgi_llm.models.config import kv_cache_bytes_per_token
    from tgi_llm.models.loader import load_model
    from tgi_llm.runner.model_runner import ModelRunner
    from tgi_llm.speculation.draft_model import DraftModelProposer
    from tgi_llm.weights import resolve_model_dir

    draft_dir = resolve_model_dir(model_id)
    try:
        vocab = AutoTokenizer.from_pretrained(draft_dir).get_vocab()
    except (OSError, ValueError) as exc:
        raise ArgumentValidationError(f"`speculative_model` {model_id} has no tokenizer: {exc}") from None
    if vocab != tokenizer.get_vocab():
        raise ArgumentValidationError(
            f"`speculative_model` {model_id} has another tokenizer than the model: its guesses would be other tokens")
    draft, draft_config = load_model(draft_dir, dtype=dtype, device=device)  # its cache passed the model's check
    kv = allocate_kv_cache(draft_config, limits.num_blocks, limits.block_size, kv_dtype, device)
    runner = ModelRunner(draft, kv, limits.block_size, draft_config.vocab_size, device)
    runner.warm_up()
    per_token = kv_cache_bytes_per_token(draft_config, kv_dtype)
    logger.info("speculative model %s: guesses up to %d tokens per step; its KV pool %.2f GiB", model_id,
                limits.speculate, limits.num_blocks * limits.block_size * per_token / 2**30)
    return DraftModelProposer(runner, vocab_size)


def _default_model_id() -> str:
    from tgi_llm.weights import DEFAULT_MODEL_ID

    return DEFAULT_MODEL_ID
