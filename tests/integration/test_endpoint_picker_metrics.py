"""The gauges the Gateway API Inference Extension's endpoint picker scrapes, under a load whose counts follow
from the engine's own block accounting: more requests than the KV pool holds, so some run and the rest wait.
Units included: `vllm:kv_cache_usage_perc` is a 0-1 fraction of the pool's blocks, as vLLM's."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from .conftest import MAX_CONCURRENT_REQUESTS
from .harness import OpenStream, metric, read_metrics, wait_until

POOL_BLOCKS = 1024  # SERVER_FLAGS: --max-batch-total-tokens 16384, blocks of 16
BLOCKS_PER_REQUEST = 60  # prompt + max_new_tokens - 1 = 960 slots: 17 requests fit, 1020 blocks
STREAMS = 20


def picker_gauges(server) -> tuple[float, float, float]:
    snapshot = read_metrics(server)
    return (metric(snapshot, "vllm:num_requests_waiting"), metric(snapshot, "vllm:num_requests_running"),
            metric(snapshot, "vllm:kv_cache_usage_perc"))


def test_queue_running_and_kv_usage_gauges_match_the_engines_accounting(server, default_model_dir):
    prompts = [f"Story {chr(65 + i)}: once upon a time" for i in range(STREAMS)]
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    lengths = {len(tokenizer(p)["input_ids"]) for p in prompts}
    assert len(lengths) == 1, "the prompts must need the same blocks for the expected counts to be exact"
    max_new_tokens = BLOCKS_PER_REQUEST * 16 - lengths.pop() + 1
    assert STREAMS <= MAX_CONCURRENT_REQUESTS
    fit = POOL_BLOCKS // BLOCKS_PER_REQUEST  # each request holds its whole life's blocks from admission on
    assert wait_until(lambda: picker_gauges(server) == (0, 0, 0), 30), picker_gauges(server)

    streams = [OpenStream(server, p, max_new_tokens=max_new_tokens) for p in prompts]
    try:
        expected = (STREAMS - fit, fit, fit * BLOCKS_PER_REQUEST / POOL_BLOCKS)
        assert wait_until(lambda: picker_gauges(server) == pytest.approx(expected), 60), \
            (picker_gauges(server), expected)
        for stream in streams:  # and they are really streaming (running) or queued, not failed
            assert stream.responses.empty() or stream.first()[1] is None
    finally:
        for stream in streams:
            stream.cancel()
    # Cancelled, every request leaves the engine and gives its blocks back.
    assert wait_until(lambda: picker_gauges(server) == (0, 0, 0), 60), picker_gauges(server)
