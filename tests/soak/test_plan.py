"""The soak's request plan: seeded, the asked-for mix, every protocol."""

from __future__ import annotations

from collections import Counter

from tgi_llm.soak.plan import CANCELLED_MAX_TOKENS, make_plan


def test_the_plan_is_seeded_and_has_the_asked_for_mix():
    plan = make_plan(5000, cancel_fraction=0.2, invalid_fraction=0.05, seed=3)
    assert plan == make_plan(5000, cancel_fraction=0.2, invalid_fraction=0.05, seed=3)
    kinds = Counter(p.kind for p in plan)
    assert 900 < kinds["cancel"] < 1100 and 180 < kinds["invalid"] < 320
    assert Counter(p.protocol for p in plan) == {"grpc": 1667, "http": 1667, "openai": 1666}
    cancels = [p for p in plan if p.kind == "cancel"]
    assert all(p.stream and p.max_tokens == CANCELLED_MAX_TOKENS for p in cancels)
    assert {p.stream for p in plan if p.kind == "normal"} == {True, False}


def test_protocols_can_be_restricted():
    assert {p.protocol for p in make_plan(10, protocols=("grpc", "http"))} == {"grpc", "http"}
