"""Smoke test of tools/simulate_routing.py on a tiny multi-turn trace: 2 replicas whose caches are small enough
to evict, every policy. What it guards: requests are neither lost nor run twice, prefix affinity finds at
least as much cached as round-robin, and the router's cache view built from KV events alone is exactly what
each replica caches at the end, evictions included (the events are complete)."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_tool():
    spec = importlib.util.spec_from_file_location("simulate_routing", ROOT / "tools" / "simulate_routing.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


sim = _load_tool()

SHAPE = sim.ChatShape(conversations=10, system_prompts=2, system_tokens=(40, 80), turns=(2, 4),
                      user_tokens=(16, 4, 40), output_tokens=(16, 4, 40), think_min_s=1.0, think_mean_s=2.0,
                      answer_s_per_token=0.05)


@pytest.fixture(scope="module")
def trace():
    return sim.chat_trace(seed=3, pool_rate=2.0, shape=SHAPE)


@pytest.fixture(scope="module")
def config(trace):
    # Room for the longest request and a few more blocks: far less than the trace's distinct blocks.
    longest = max(len(r.prompt) + len(r.output) - 1 for r in trace)
    return sim.ReplicaConfig(kv_blocks=-(-longest // sim.BLOCK_SIZE) + 8)


@pytest.fixture(scope="module")
def results(trace, config):
    return {p: sim.simulate(trace, p, replicas=2, config=config, seed=3) for p in sim.POLICIES}


def test_every_request_completes_exactly_once(trace, results):
    for policy, res in results.items():
        assert Counter(res.completions) == Counter(range(len(trace))), policy
        assert all(s.generated == len(s.output) and s.done_s >= s.first_token_s >= s.arrival_s
                   for s in res.sequences), policy


def test_prefix_affinity_finds_at_least_what_round_robin_finds(results):
    assert results["prefix-affinity"].hit_rate >= results["round-robin"].hit_rate
    assert results["prefix-affinity"].hit_rate > 0


def test_router_view_from_events_is_each_replica_cache_through_evictions(results):
    for policy, res in results.items():
        assert res.removed_blocks > 0, f"{policy}: the cache never evicted; the test proves nothing"
        assert res.router_view == res.cached, policy
        assert any(res.cached), policy


def test_a_recorded_trace_replays_the_same(tmp_path, trace):
    path = tmp_path / "chat.jsonl"
    sim.write_trace(path, trace)
    again = sim.read_trace(path)
    assert [(r.conversation, r.turn, r.prompt, r.output) for r in again] == \
        [(r.conversation, r.turn, r.prompt, r.output) for r in trace]
    assert [round(r.arrival_s, 6) for r in trace] == [r.arrival_s for r in again]
    assert any(r.extends_turn is not None for r in again)  # the compact form was used
