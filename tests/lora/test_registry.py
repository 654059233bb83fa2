"""The adapter registry: names, slots shared and recycled least-recently-used, unloading after the last use."""

from __future__ import annotations

import pytest

from tgi_llm.errors import ValidationError
from tgi_llm.lora.registry import LoraRegistry


def _registry(slots: int = 2, bad: frozenset[str] = frozenset()) -> LoraRegistry:
    def check(path: str) -> None:
        if path in bad:
            raise ValueError(f"{path} does not fit")

    return LoraRegistry(slots, 16, check, runtime_loading=True)


def test_names_are_unique_and_unknown_ones_are_named():
    lora = _registry(bad=frozenset({"/broken"}))
    lora.register("a", "/a")
    with pytest.raises(KeyError, match="already loaded"):
        lora.register("a", "/b")
    with pytest.raises(ValueError, match="does not fit"):
        lora.register("b", "/broken")
    with pytest.raises(ValidationError, match="'zz' is not loaded .*loaded adapters: a"):
        lora.lookup("zz")


def test_a_resident_adapter_shares_its_slot_and_loads_once():
    lora = _registry()
    a = lora.register("a", "/a")
    first, second = lora.admit(a), lora.admit(a)
    assert first == second
    assert [(load.slot, load.path) for load in lora.take_loads()] == [(first, "/a")]
    assert lora.take_loads() == []


def test_the_least_recently_used_free_slot_is_recycled_and_pinned_slots_never():
    lora = _registry(slots=2)
    a, b, c = (lora.register(n, f"/{n}") for n in "abc")
    sa, sb = lora.admit(a), lora.admit(b)
    assert not lora.can_admit(c)  # both slots run requests
    lora.leave(sa)
    lora.leave(sb)  # b used last: a's slot goes first
    lora.take_loads()
    assert lora.admit(c) == sa
    assert [load.path for load in lora.take_loads()] == ["/c"]
    assert lora.admit(b) == sb and lora.take_loads() == []  # still resident


def test_unloading_waits_for_the_requests_that_use_it():
    lora = _registry(slots=1)
    a = lora.register("a", "/a")
    lora.hold(a)
    slot = lora.admit(a)
    lora.unregister("a")
    with pytest.raises(ValidationError):
        lora.lookup("a")  # no new requests
    b = lora.register("a", "/a2")  # the name is free again: another adapter, another cache key
    assert b.cache_key != a.cache_key
    assert not lora.can_admit(b)  # the old one still runs in the only slot
    lora.leave(slot)
    lora.drop(a)
    assert lora.can_admit(b)
    assert lora.stats([]).requests_total == {"a": 1}
