"""TGI's metric names, labels and values, through a fake pb_utils.MetricFamily."""

from __future__ import annotations

import gc
import weakref

from tgi_llm.engine.stats import EngineStats, StepStats
from tgi_llm.errors import OverloadedError, ValidationError
from tgi_llm.events import FinalEvent, FinishReason
from tgi_llm.triton.metrics import TgiMetrics

from .fakes import FakeFamilies

EXPECTED = {
    "tgi_request_count", "tgi_request_success", "tgi_request_failure", "tgi_queue_size", "tgi_batch_current_size",
    "tgi_batch_current_max_tokens", "tgi_batch_inference_count", "tgi_request_duration",
    "tgi_request_queue_duration", "tgi_request_inference_duration", "tgi_request_mean_time_per_token_duration",
    "tgi_request_generated_tokens", "tgi_request_input_length", "tgi_batch_forward_duration",
    "tgi_kv_blocks_used", "tgi_kv_blocks_free",
}


def make() -> tuple[TgiMetrics, FakeFamilies]:
    families = FakeFamilies()
    return TgiMetrics(families, max_input_tokens=100, max_total_tokens=200), families


def test_every_tgi_metric_is_registered():
    _, families = make()
    assert EXPECTED <= set(families.families)


def test_request_outcomes():
    metrics, f = make()
    for _ in range(3):
        metrics.request_received()
    metrics.request_failed(ValidationError("`top_p` must be > 0.0 and < 1.0"))
    metrics.request_failed(OverloadedError())
    final = FinalEvent(1, "ab", FinishReason.LENGTH, generated_tokens=4, input_tokens=7, seed=None, token_ids=[],
                       queue_time_s=0.5, inference_time_s=2.0)
    metrics.request_succeeded(final, duration_s=2.6)
    assert f.value("tgi_request_count") == 3
    assert f.value("tgi_request_failure", err="validation") == 1
    assert f.value("tgi_request_failure", err="overloaded") == 1
    assert f.value("tgi_request_success") == 1
    assert f.observations("tgi_request_mean_time_per_token_duration") == [0.5]
    assert f.observations("tgi_request_generated_tokens") == [4.0]
    assert f.observations("tgi_request_input_length") == [7.0]
    assert f.metric("tgi_request_input_length").buckets[-1] == 100.0


def test_gauges_are_written_only_when_they_change():
    metrics, f = make()
    stats = EngineStats(queue_size=2, batch_size=3, batch_max_tokens=40, kv_blocks_total=10, kv_blocks_free=7,
                        running=5)
    metrics.engine_stats(stats)
    metrics.engine_stats(stats)
    assert f.value("tgi_kv_blocks_used") == 3 and f.value("tgi_kv_blocks_free") == 7
    assert f.metric("tgi_queue_size").calls == 1


def test_prefix_cache_counters_advance_by_what_the_engine_counted_and_vllm_gauges_follow():
    metrics, f = make()
    base = dict(queue_size=4, batch_size=2, batch_max_tokens=40, kv_blocks_total=10, kv_blocks_free=6, running=6,
                kv_blocks_cached=3)
    metrics.engine_stats(EngineStats(**base, prefix_cache_queried_tokens=100, prefix_cache_hit_tokens=64))
    metrics.engine_stats(EngineStats(**base, prefix_cache_queried_tokens=100, prefix_cache_hit_tokens=64))
    metrics.engine_stats(EngineStats(**base, prefix_cache_queried_tokens=130, prefix_cache_hit_tokens=80))
    assert f.value("vllm:prefix_cache_queries") == 130 and f.value("vllm:prefix_cache_hits") == 80
    assert f.value("tgi_kv_blocks_cached") == 3
    assert f.value("vllm:num_requests_waiting") == 4 and f.value("vllm:num_requests_running") == 2
    assert f.value("vllm:kv_cache_usage_perc") == 0.4


def test_the_cache_configuration_is_an_info_gauge():
    metrics, f = make()
    metrics.cache_config(16, 1024)
    assert f.value("vllm:cache_config_info", block_size="16", num_gpu_blocks="1024") == 1


def test_grammar_counters_and_mask_times():
    metrics, f = make()
    base = dict(queue_size=0, batch_size=0, batch_max_tokens=0, kv_blocks_total=10, kv_blocks_free=10, running=0)
    metrics.engine_stats(EngineStats(**base, grammar_requests=3, grammar_compiled=2, grammar_cache_hits=1,
                                     grammar_compile_s=0.004))
    assert f.value("tgi_grammar_requests") == 3 and f.value("tgi_grammar_cache_hits") == 1
    assert f.value("tgi_grammar_compiled") == 2 and f.value("tgi_grammar_compile_seconds") == 0.004
    metrics.steps([StepStats("decode", 2, 2, 0, 0.02, 0.01, grammar_mask_s=0.001),
                   StepStats("decode", 2, 2, 0, 0.02, 0.01)])
    assert f.observations("tgi_grammar_mask_duration") == [0.001]


def test_steps_by_method():
    metrics, f = make()
    metrics.steps([StepStats("prefill", 2, 10, 2, 0.1, 0.01), StepStats("decode", 2, 2, 0, 0.02, 0.01),
                   StepStats("decode", 2, 2, 0, 0.03, 0.01)])
    assert f.value("tgi_batch_inference_count", method="decode") == 2
    assert f.value("tgi_batch_inference_count", method="prefill") == 1
    assert f.observations("tgi_batch_forward_duration", method="decode") == [0.02, 0.03]


def test_memory_gauge_by_kind():
    from tgi_llm.memory import MemoryAccount

    metrics, f = make()
    metrics.memory(MemoryAccount(weights=100, kv_cache=1000, kv_cache_resident=200, rss=500))
    assert f.value("tgi_memory_bytes", kind="weights") == 100
    assert f.value("tgi_memory_bytes", kind="kv_cache") == 1000
    assert f.value("tgi_memory_bytes", kind="other") == 200  # 500 resident - 100 weights - 200 KV touched


def test_close_lets_go_of_every_metric_and_family():
    families = FakeFamilies()
    metrics = TgiMetrics(families, max_input_tokens=10, max_total_tokens=20)
    metrics.request_received()
    refs = [weakref.ref(f) for f in families.families.values()]
    families.families.clear()  # only the metrics object holds them now
    metrics.close()
    gc.collect()
    assert all(ref() is None for ref in refs)  # destroyed now, not at interpreter exit
