"""Start-up limits, resolved and checked the way TGI's launcher does it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from tgi_llm.errors import ArgumentValidationError

logger = logging.getLogger(__name__)

#: TGI caps its default context at 4096 tokens to leave KV memory for more users.
DEFAULT_MAX_TOTAL_TOKENS = 4096
#: With chunking on a CPU: the most prompt tokens one step takes, and the step time it aims for while
#: streams decode (the longest a running stream then waits for its next token; pacing.py).
CPU_STEP_TOKENS = 512
#: 300 ms bounds a stream's wait while a prompt prefills; 400 ms made a prompt-carrying step several
#: times the median token wait at 32 streams (docs/PERFORMANCE.md, "What limits each number now").
CPU_STEP_TARGET_MS = 300
#: --scheduling-policy: the order waiting requests are admitted in (queue_order.py).
FCFS, SHORTEST_PROMPT = "fcfs", "shortest-prompt"
SCHEDULING_POLICIES = (SHORTEST_PROMPT, FCFS)
#: More guessed tokens per step than this only add rows: a guess's chance of surviving falls with each.
MAX_SPECULATE = 16


def default_step_tokens(device_type: str) -> int | None:
    """The chunked-prefill step budget for a device, when the operator sets none (None: TGI's default)."""
    return CPU_STEP_TOKENS if device_type == "cpu" else None


def default_step_target_ms(device_type: str) -> int | None:
    return CPU_STEP_TARGET_MS if device_type == "cpu" else None


@dataclass(frozen=True)
class LimitOptions:
    """What the operator asked for; None means "derive it as TGI does"."""

    max_concurrent_requests: int = 128
    max_best_of: int = 2
    max_stop_sequences: int = 4
    max_top_n_tokens: int = 5
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int | None = None
    max_batch_total_tokens: int | None = None
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20
    max_batch_size: int | None = None
    block_size: int = 16
    #: Reuse the KV blocks of prompt prefixes seen before (TGI v3's prefix caching; env PREFIX_CACHING).
    prefix_caching: bool = True
    #: Split prompts across steps within the step budget (TGI v3's chunking; env PREFILL_CHUNKING).
    prefill_chunking: bool = True
    #: With chunking, while streams decode, a step takes only the prompt tokens that fit this time
    #: (pacing.py); None: the device's default (CPU 300 ms), 0: never paced.
    prefill_step_target_ms: int | None = None
    #: Tokens each decode may guess and verify in one step (TGI's --speculate; env SPECULATE); 0: off. The
    #: server's default is speculation.policy.SERVED_SPECULATE; the Python API asks for it.
    speculate: int = 0
    #: With chunking, which waiting request is admitted next (vLLM's --scheduling-policy; queue_order.py).
    scheduling_policy: str = SHORTEST_PROMPT


@dataclass(frozen=True)
class Limits:
    """Every limit with a value; the scheduler and validator read only this."""

    max_concurrent_requests: int
    max_best_of: int
    max_stop_sequences: int
    max_top_n_tokens: int
    max_input_tokens: int
    max_total_tokens: int
    max_batch_prefill_tokens: int
    max_batch_total_tokens: int
    waiting_served_ratio: float
    max_waiting_tokens: int
    max_batch_size: int | None
    block_size: int
    prefix_caching: bool = True
    prefill_chunking: bool = True
    prefill_step_target_ms: int | None = None  # None: no pacing
    speculate: int = 0
    scheduling_policy: str = SHORTEST_PROMPT

    @property
    def num_blocks(self) -> int:
        return self.max_batch_total_tokens // self.block_size


def _fail(message: str) -> None:
    raise ArgumentValidationError(message)


def check_static_limits(opts: LimitOptions) -> None:
    """The checks that need no model: TGI's launcher messages, naming both values."""
    mit, mtt = opts.max_input_tokens, opts.max_total_tokens
    if mit is not None and mtt is not None and mit >= mtt:
        _fail(f"`max_input_tokens`({mit}) must be < `max_total_tokens`({mtt})")
    prefill, total = opts.max_batch_prefill_tokens, opts.max_batch_total_tokens
    # With chunking a prompt spans several steps: max_batch_prefill_tokens is the step budget only.
    if mit is not None and prefill is not None and mit > prefill and not opts.prefill_chunking:
        _fail(f"`max_batch_prefill_tokens` must be >= `max_input_tokens`. Given: {prefill} and {mit}")
    if mtt is not None and total is not None and mtt > total:  # first: a derived prefill budget follows total
        _fail(f"`max_total_tokens` must be <= `max_batch_total_tokens`. Given: {mtt} and {total}")
    if prefill is not None and total is not None and prefill > total:
        _fail(f"`max_batch_prefill_tokens` must be <= `max_batch_total_tokens`. Given: {prefill} and {total}")
    for name in ("max_concurrent_requests", "max_waiting_tokens", "block_size"):
        if getattr(opts, name) <= 0:
            _fail(f"`{name}` must be > 0. Given: {getattr(opts, name)}")
    if opts.scheduling_policy not in SCHEDULING_POLICIES:
        _fail(f"`scheduling_policy` must be one of {', '.join(SCHEDULING_POLICIES)}. Given: {opts.scheduling_policy}")
    if opts.prefill_step_target_ms is not None and opts.prefill_step_target_ms < 0:
        _fail(f"`prefill_step_target_ms` must be >= 0. Given: {opts.prefill_step_target_ms}")
    if not 0 <= opts.speculate <= MAX_SPECULATE:
        _fail(f"`speculate` must be >= 0 and <= {MAX_SPECULATE}. Given: {opts.speculate}")
    for name in ("max_best_of", "max_stop_sequences", "max_top_n_tokens"):
        if getattr(opts, name) < 0:
            _fail(f"`{name}` must be >= 0. Given: {getattr(opts, name)}")
    if opts.max_best_of < 1:
        _fail(f"`max_best_of` must be >= 1. Given: {opts.max_best_of}")
    if not 0.0 <= opts.waiting_served_ratio:
        _fail(f"`waiting_served_ratio` must be >= 0. Given: {opts.waiting_served_ratio}")
    if opts.max_batch_size is not None and opts.max_batch_size <= 0:
        _fail(f"`max_batch_size` must be > 0. Given: {opts.max_batch_size}")


def resolve_max_total_tokens(opts: LimitOptions, max_position_embeddings: int | None) -> int:
    """The longest request (prompt + generation) as TGI derives it: --max-total-tokens, else one past a
    --max-input-tokens of at least the default, else the default (4096, or the model's context if shorter)."""
    if opts.max_total_tokens is not None:
        return opts.max_total_tokens
    max_default = DEFAULT_MAX_TOTAL_TOKENS
    if max_position_embeddings is not None:
        max_default = min(max_default, max_position_embeddings)
    mit = opts.max_input_tokens
    return mit + 1 if mit is not None and mit >= max_default else max_default


def resolve_limits(
    opts: LimitOptions, max_position_embeddings: int | None, kv_cache_tokens: int | None,
    default_step_tokens: int | None = None, default_step_target_ms: int | None = None,
) -> Limits:
    """Fill the unset limits as TGI does, then check every combination.

    `max_position_embeddings`: the model's context, times --rope-factor where given (None: unknown).
    `kv_cache_tokens` is how many tokens the KV-cache memory budget holds (TGI's warm-up
    measures this); it becomes `max_batch_total_tokens` when the operator did not set one. Whether one
    request of `max_total_tokens` fits it is the builder's check (engine/builder.py check_context_fits), which
    knows the bytes to name; here a pool too small fails TGI's `max_batch_total_tokens` check.
    `default_step_tokens` / `default_step_target_ms`: with chunking, the device's default step budget and
    pacing target (a CPU forward of 4,000 tokens takes seconds, during which every stream stalls);
    None: TGI's budget, no pacing.
    """
    check_static_limits(opts)
    mtt = resolve_max_total_tokens(opts, max_position_embeddings)
    mit = mtt - 1 if opts.max_input_tokens is None else opts.max_input_tokens
    prefill = opts.max_batch_prefill_tokens
    if prefill is None:
        prefill = mit + 50  # TGI: "a bit of room" above the longest prompt
        if opts.prefill_chunking and default_step_tokens is not None:
            prefill = min(prefill, default_step_tokens)
    total = opts.max_batch_total_tokens
    if total is None:
        if kv_cache_tokens is None:
            _fail("`max_batch_total_tokens` must be set when the KV-cache budget is unknown")
        total = kv_cache_tokens
        if prefill > total and opts.max_batch_prefill_tokens is None:
            prefill = max(mit, total)
        logger.info("Setting max batch total tokens to %d", total)
    total -= total % opts.block_size
    target = opts.prefill_step_target_ms if opts.prefill_step_target_ms is not None else default_step_target_ms
    resolved = replace(
        opts, max_input_tokens=mit, max_total_tokens=mtt, max_batch_prefill_tokens=prefill,
        max_batch_total_tokens=total,
        prefill_step_target_ms=target if opts.prefill_chunking and target and target > 0 else None,
    )
    check_static_limits(resolved)
    if max_position_embeddings is not None and mtt > max_position_embeddings:
        # TGI lets it pass too (the launcher only caps its default by it): rope has no table to outgrow here,
        # and a model whose config understates its context still serves.
        logger.warning(
            "`max_total_tokens` (%d) exceeds the %d positions the model allows (max_position_embeddings, times "
            "--rope-factor where given): past them its output degrades; `--rope-scaling` with a `--rope-factor` "
            "that covers it stretches the rope", mtt, max_position_embeddings,
        )
    return Limits(**{f: getattr(resolved, f) for f in Limits.__dataclass_fields__})
