"""Which requests a soak sends: protocol, kind (normal, cancelled, invalid), streaming, length; seeded."""

from __future__ import annotations

import random
from dataclasses import dataclass

PROTOCOLS = ("grpc", "http", "openai")
PROMPTS = ("What is deep learning?", "Tell me a story about a cat.", "Write a haiku about the sea.",
           "List three prime numbers.", "Explain TCP in one sentence.", "Count from one to twenty:")
#: Long enough that a request cancelled after its first token is still running when the cancel lands.
CANCELLED_MAX_TOKENS = 200


@dataclass(frozen=True)
class Planned:
    index: int
    protocol: str  # grpc (Triton gRPC streaming), http (Triton HTTP generate), openai (the front's /v1)
    kind: str  # normal, cancel (after the first token), invalid (top_p out of range: the model refuses it)
    stream: bool
    max_tokens: int
    prompt: str


def make_plan(n: int, cancel_fraction: float = 0.2, invalid_fraction: float = 0.05, seed: int = 0,
              protocols: tuple[str, ...] = PROTOCOLS) -> list[Planned]:
    rng = random.Random(seed)
    plan = []
    for i in range(n):
        draw = rng.random()
        kind = "cancel" if draw < cancel_fraction else "invalid" if draw < cancel_fraction + invalid_fraction \
            else "normal"
        stream = True if kind == "cancel" else rng.random() < 0.5
        max_tokens = CANCELLED_MAX_TOKENS if kind == "cancel" else rng.randint(4, 24)
        plan.append(Planned(i, protocols[i % len(protocols)], kind, stream, max_tokens, rng.choice(PROMPTS)))
    return plan
