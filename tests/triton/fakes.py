"""Stand-ins for the pb_utils side: response senders, the response API, metric families."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tgi_llm.triton.status import CodeTaggingSender


@dataclass
class Sent:
    outputs: dict[str, np.ndarray] | None
    error: BaseException | None
    final: bool
    tagged: bool = False  # sent through a CodeTaggingSender (PbResponses would tag its error's message)

    def text(self) -> str:
        return self.outputs["text_output"][0].decode() if self.outputs and "text_output" in self.outputs else ""


@dataclass
class FakeSender:
    responses: list[Sent] = field(default_factory=list)
    cancelled: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def finals(self) -> list[Sent]:
        return [r for r in self.responses if r.final]

    def text(self) -> str:
        return "".join(r.text() for r in self.responses)

    def is_cancelled(self) -> bool:
        return self.cancelled


class FakeApi:
    def __init__(self) -> None:
        self.cancel_checks = 0

    def send(self, sender: FakeSender | CodeTaggingSender, outputs, error, final: bool) -> None:
        tagged = isinstance(sender, CodeTaggingSender)
        sender = sender.sender if tagged else sender
        if sender.finals:
            raise AssertionError("a response was sent after the final one")
        sender.responses.append(Sent(outputs, error, final, tagged))
        if final:
            sender.done.set()

    def is_cancelled(self, sender: FakeSender | CodeTaggingSender) -> bool:
        self.cancel_checks += 1
        return sender.is_cancelled()


class FakeMetric:
    def __init__(self, kind: str, buckets: list[float] | None) -> None:
        self.kind = kind
        self.buckets = buckets
        self.value = 0.0
        self.observations: list[float] = []
        self.calls = 0

    def increment(self, value: float) -> None:
        assert self.kind == "counter" and value >= 0
        self.value += value
        self.calls += 1

    def set(self, value: float) -> None:
        assert self.kind == "gauge"
        self.value = value
        self.calls += 1

    def observe(self, value: float) -> None:
        assert self.kind == "histogram" and self.buckets
        self.observations.append(value)
        self.calls += 1


class FakeFamily:
    def __init__(self, name: str, kind: str) -> None:
        self.name = name
        self.kind = kind
        self.metrics: dict[tuple, FakeMetric] = {}

    def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> FakeMetric:  # noqa: N802
        key = tuple(sorted(labels.items()))
        assert key not in self.metrics, "a metric was created twice for the same labels"
        self.metrics[key] = FakeMetric(self.kind, buckets)
        return self.metrics[key]


class FakeFamilies:
    """family_factory for TgiMetrics; `value(name, **labels)` reads a counter/gauge back."""

    def __init__(self) -> None:
        self.families: dict[str, FakeFamily] = {}

    def __call__(self, name: str, description: str, kind: str) -> FakeFamily:
        assert name.startswith(("tgi_", "vllm:")) and description
        self.families[name] = FakeFamily(name, kind)
        return self.families[name]

    def metric(self, name: str, **labels: str) -> FakeMetric | None:
        return self.families[name].metrics.get(tuple(sorted(labels.items())))

    def value(self, name: str, **labels: str) -> float:
        metric = self.metric(name, **labels)
        return 0.0 if metric is None else metric.value

    def observations(self, name: str, **labels: str) -> list[float]:
        metric = self.metric(name, **labels)
        return [] if metric is None else metric.observations


def tensors(**values: Any):
    """A `tensor(name)` getter over numpy arrays, as pb_utils gives them."""
    arrays = {k: v if isinstance(v, np.ndarray) else np.array(v) for k, v in values.items()}
    return arrays.get
