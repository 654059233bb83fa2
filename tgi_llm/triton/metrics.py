"""TGI's Prometheus metrics, served on Triton's metrics port through `pb_utils.MetricFamily`.

Every call here is a blocking round trip to the Triton process, so only the responder thread
records metrics (never the engine thread), gauges are written only when they change, and the
engine's per-step timings are drained in batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from tgi_llm.engine.stats import EngineStats, StepStats
from tgi_llm.events import FinalEvent
from tgi_llm.lora.registry import LoraStats
from tgi_llm.triton.status import failure_label

#: family_factory(name, description, kind) -> an object with `.Metric(labels=..., buckets=...)`,
#: as pb_utils.MetricFamily; kind is "counter", "gauge" or "histogram".
FamilyFactory = Callable[[str, str, str], Any]

#: TGI's duration buckets: 0.2 ms doubling up to ~52 s.
DURATION_BUCKETS = [0.0001 * 2**i for i in range(1, 20)]

_COUNTERS = {
    "tgi_request_count": "Requests received (valid or not)",
    "tgi_request_success": "Requests that finished with generated text",
    "tgi_request_failure": "Requests that ended with an error, by error type",
    "tgi_batch_inference_count": "Forward passes run, by method (prefill or decode)",
    "tgi_batch_inference_success": "Forward passes that succeeded, by method",
    # vLLM's names (TGI has none): what inference gateways and dashboards already read.
    "vllm:prefix_cache_queries": "Prompt tokens looked up in the prefix cache",
    "vllm:prefix_cache_hits": "Prompt tokens found in the prefix cache (their K/V was not computed again)",
    "tgi_grammar_requests": "Requests with a grammar (structured output, tool calls)",
    "tgi_grammar_compiled": "Grammars compiled (the others came from the cache)",
    "tgi_grammar_cache_hits": "Grammars found compiled in the cache",
    "tgi_grammar_compile_seconds": "Seconds spent compiling grammars",
    # Speculative decoding, by vLLM's names.
    "vllm:spec_decode_num_drafts": "Verify steps: decodes that fed draft tokens",
    "vllm:spec_decode_num_draft_tokens": "Draft tokens verified",
    "vllm:spec_decode_num_accepted_tokens": "Draft tokens accepted (each saved a step)",
    "tgi_lora_requests": "Requests received for each LoRA adapter",
}
_GAUGES = {
    "tgi_queue_size": "Requests waiting to be admitted into the batch",
    "tgi_batch_current_size": "Requests in the running batch",
    "tgi_batch_current_max_tokens": "Tokens the running batch may use at most (prompts + max new tokens)",
    "tgi_kv_blocks_total": "KV-cache blocks in the pool",
    "tgi_kv_blocks_used": "KV-cache blocks held by requests",
    "tgi_kv_blocks_free": "KV-cache blocks free (including cached ones no request holds)",
    "tgi_kv_blocks_cached": "Free KV-cache blocks that hold reusable prefix-cache entries",
    "tgi_memory_bytes": "Bytes held by the model process at start-up, by kind (weights, kv_cache, other)",
    # vLLM's names, read by Kubernetes' Gateway API Inference Extension to route between servers.
    "vllm:num_requests_waiting": "Requests waiting to be admitted into the batch",
    "vllm:num_requests_running": "Requests in the running batch",
    "vllm:kv_cache_usage_perc": "Fraction of KV-cache blocks held by requests (0 to 1)",
    "vllm:cache_config_info": "The KV cache's configuration in its labels (block_size in tokens, num_gpu_blocks: "
                              "blocks in the pool, whatever the device); the value is 1",
    # The Gateway API Inference Extension's LoRA affinity reads its labels; the value is when they last changed.
    "vllm:lora_requests_info": "LoRA adapters: max_lora resident at once, running_lora_adapters and "
                               "waiting_lora_adapters (comma-separated); the value is the Unix time of the change",
}
_HISTOGRAMS = {
    "tgi_request_duration": "Seconds from request received to its final response",
    "tgi_request_queue_duration": "Seconds a request waited before its prefill",
    "tgi_request_inference_duration": "Seconds from prefill to the last token",
    "tgi_request_mean_time_per_token_duration": "Inference seconds per generated token",
    "tgi_request_generated_tokens": "Tokens generated per request",
    "tgi_request_input_length": "Prompt tokens per request",
    "tgi_batch_forward_duration": "Seconds per forward pass, by method",
    "tgi_grammar_mask_duration": "Seconds per step computing and applying grammar masks",
    "tgi_request_skipped_tokens": "Draft tokens accepted per request (tokens that took no step of their own)",
}


def _linear_buckets(limit: int) -> list[float]:
    step = max(limit / 20.0, 1.0)
    return [step * (i + 1) for i in range(20)]


class TgiMetrics:
    def __init__(self, family_factory: FamilyFactory, max_input_tokens: int, max_total_tokens: int) -> None:
        self._families: dict[str, Any] = {}
        for kind, table in (("counter", _COUNTERS), ("gauge", _GAUGES), ("histogram", _HISTOGRAMS)):
            for name, description in table.items():
                self._families[name] = family_factory(name, description, kind)
        self._buckets = {
            "tgi_request_generated_tokens": _linear_buckets(max_total_tokens),
            "tgi_request_skipped_tokens": _linear_buckets(max_total_tokens),
            "tgi_request_input_length": _linear_buckets(max_input_tokens),
        }
        self._metrics: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._gauge_values: dict[str, float] = {}
        self._counter_totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def _metric(self, name: str, **labels: str) -> Any:
        key = (name, tuple(sorted(labels.items())))
        metric = self._metrics.get(key)
        if metric is None:
            if name in _HISTOGRAMS:
                buckets = self._buckets.get(name, DURATION_BUCKETS)
                metric = self._families[name].Metric(labels=labels, buckets=buckets)
            else:
                metric = self._families[name].Metric(labels=labels)
            self._metrics[key] = metric
        return metric

    def request_received(self, count: int = 1) -> None:
        self._metric("tgi_request_count").increment(float(count))

    def request_failed(self, error: BaseException) -> None:
        self._metric("tgi_request_failure", err=failure_label(error)).increment(1.0)

    def request_succeeded(self, final: FinalEvent, duration_s: float) -> None:
        self._metric("tgi_request_success").increment(1.0)
        self._metric("tgi_request_duration").observe(duration_s)
        self._metric("tgi_request_queue_duration").observe(final.queue_time_s)
        self._metric("tgi_request_inference_duration").observe(final.inference_time_s)
        if final.generated_tokens > 0:
            per_token = final.inference_time_s / final.generated_tokens
            self._metric("tgi_request_mean_time_per_token_duration").observe(per_token)
        self._metric("tgi_request_generated_tokens").observe(float(final.generated_tokens))
        self._metric("tgi_request_input_length").observe(float(final.input_tokens))
        self._metric("tgi_request_skipped_tokens").observe(float(final.accepted_draft_tokens))

    def engine_stats(self, stats: EngineStats) -> None:
        self._gauge("tgi_queue_size", stats.queue_size)
        self._gauge("tgi_batch_current_size", stats.batch_size)
        self._gauge("tgi_batch_current_max_tokens", stats.batch_max_tokens)
        self._gauge("tgi_kv_blocks_total", stats.kv_blocks_total)
        self._gauge("tgi_kv_blocks_used", stats.kv_blocks_used)
        self._gauge("tgi_kv_blocks_free", stats.kv_blocks_free)
        self._gauge("tgi_kv_blocks_cached", stats.kv_blocks_cached)
        self._gauge("vllm:num_requests_waiting", stats.queue_size)
        self._gauge("vllm:num_requests_running", stats.batch_size)
        self._gauge("vllm:kv_cache_usage_perc", stats.kv_blocks_used / max(stats.kv_blocks_total, 1))
        self._advance("vllm:prefix_cache_queries", stats.prefix_cache_queried_tokens)
        self._advance("vllm:prefix_cache_hits", stats.prefix_cache_hit_tokens)
        self._advance("tgi_grammar_requests", stats.grammar_requests)
        self._advance("tgi_grammar_compiled", stats.grammar_compiled)
        self._advance("tgi_grammar_cache_hits", stats.grammar_cache_hits)
        self._advance("tgi_grammar_compile_seconds", stats.grammar_compile_s)
        self._advance("vllm:spec_decode_num_drafts", stats.spec_drafts)
        self._advance("vllm:spec_decode_num_draft_tokens", stats.spec_draft_tokens)
        self._advance("vllm:spec_decode_num_accepted_tokens", stats.spec_accepted_tokens)
        if stats.lora is not None:
            self._lora(stats.lora)

    def _lora(self, lora: LoraStats) -> None:
        labels = {"max_lora": str(lora.max_loras), "running_lora_adapters": ",".join(sorted(lora.running)),
                  "waiting_lora_adapters": ",".join(lora.waiting)}
        key = ("vllm:lora_requests_info", tuple(sorted(labels.items())))
        if key not in self._metrics:  # one series at a time: the old one goes with its labels
            for old in [k for k in self._metrics if k[0] == "vllm:lora_requests_info"]:
                del self._metrics[old]
            self._metric("vllm:lora_requests_info", **labels).set(time.time())
        for name, total in lora.requests_total.items():
            self._advance("tgi_lora_requests", total, adapter=name)

    def cache_config(self, block_size: int, num_blocks: int) -> None:
        """vLLM's cache_config_info, which the Gateway API Inference Extension reads for the pool's geometry."""
        self._metric("vllm:cache_config_info", block_size=str(block_size), num_gpu_blocks=str(num_blocks)).set(1.0)

    def memory(self, account: Any) -> None:
        """A tgi_llm.memory.MemoryAccount: weights, the KV pool, and the rest of the resident memory."""
        for kind, value in (("weights", account.weights), ("kv_cache", account.kv_cache), ("other", account.other)):
            self._metric("tgi_memory_bytes", kind=kind).set(float(value))
        if account.lora_adapters:
            self._metric("tgi_memory_bytes", kind="lora_adapters").set(float(account.lora_adapters))

    def steps(self, steps: Iterable[StepStats]) -> None:
        counts: dict[str, int] = {}
        for step in steps:
            counts[step.method] = counts.get(step.method, 0) + 1
            self._metric("tgi_batch_forward_duration", method=step.method).observe(step.forward_s)
            if step.grammar_mask_s:
                self._metric("tgi_grammar_mask_duration").observe(step.grammar_mask_s)
        for method, n in counts.items():
            self._metric("tgi_batch_inference_count", method=method).increment(float(n))
            self._metric("tgi_batch_inference_success", method=method).increment(float(n))

    def _advance(self, name: str, total: float, **labels: str) -> None:
        """A counter the engine keeps as a running total: add what it gained since the last reading."""
        key = (name, tuple(sorted(labels.items())))
        delta = total - self._counter_totals.get(key, 0)
        if delta > 0:
            self._metric(name, **labels).increment(float(delta))
            self._counter_totals[key] = total

    def close(self) -> None:
        """Drop every metric and family now. Their destructors talk to tritonserver through the stub's shared
        memory: left to the interpreter's exit, they ran after the stub had torn that down and segfaulted it
        (`MetricFamily::SaveToSharedMemory`), on every stop."""
        self._metrics.clear()
        self._families.clear()

    def _gauge(self, name: str, value: float) -> None:
        if self._gauge_values.get(name) != value:
            self._metric(name).set(float(value))
            self._gauge_values[name] = value
