"""Snapshots the engine exposes for metrics and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

from tgi_llm.lora.registry import LoraStats


@dataclass(frozen=True)
class EngineStats:
    queue_size: int
    batch_size: int
    batch_max_tokens: int
    kv_blocks_total: int
    kv_blocks_free: int  # what an allocation can take: nothing held, cached or not
    running: int  # requests between submit and their final event
    kv_blocks_cached: int = 0  # of the free ones, those holding reusable prefix-cache entries
    prefix_cache_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache (a counter)
    prefix_cache_hit_tokens: int = 0  # of those, found cached (a counter)
    grammar_requests: int = 0  # requests submitted with a grammar (a counter)
    grammar_compiled: int = 0  # grammars compiled (a counter; the others came from the cache)
    grammar_cache_hits: int = 0
    grammar_compile_s: float = 0.0  # seconds spent compiling grammars (a counter)
    spec_drafts: int = 0  # decodes that fed draft tokens (a counter)
    spec_draft_tokens: int = 0  # draft tokens verified (a counter)
    spec_accepted_tokens: int = 0  # of those, accepted (a counter)
    lora: LoraStats | None = None  # the LoRA adapters (None: the server takes none)

    @property
    def kv_blocks_used(self) -> int:
        return self.kv_blocks_total - self.kv_blocks_free


@dataclass(frozen=True)
class StepStats:
    method: str  # "prefill" when the step computes prompt tokens, else "decode" (TGI's metric label)
    batch_size: int
    num_tokens: int
    num_prefill: int  # sequences computing prompt tokens (whole prompts or chunks)
    forward_s: float
    bookkeeping_s: float  # scheduling (prefix-cache lookups included) + updating sequences, engine thread
    schedule_s: float = 0.0  # of which scheduling
    grammar_mask_s: float = 0.0  # computing and applying grammar masks (part of the forward's time)
