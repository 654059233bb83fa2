"""Request sets for the benchmark: fixed or mixed input/output lengths, prompts built with the model's tokenizer.

Prompts are windows of natural text (random token ids decode to text that re-tokenizes to other lengths),
cut so that the tokenizer, called as the engine calls it (`add_special_tokens=True`), gives the asked
length. Mixed lengths are drawn uniformly from ranges, as vLLM's and SGLang's `random` datasets do.
Everything is seeded: the same spec and tokenizer give the same requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

# Plain original prose; any text works, it only has to tokenize like real input.
CORPUS = (
    "The river town woke slowly. Fishermen checked their nets while the baker pulled the first loaves from a "
    "stone oven, and the smell of bread drifted over the water. Children ran along the quay, chasing gulls "
    "that rose and settled again a few steps further on. An old ferry, painted blue a long time ago, waited "
    "at the landing for passengers who were in no hurry at all. In the library on the hill, a student read "
    "about the history of bridges: how the first ones were only fallen trees, how the Romans learned to build "
    "arches that carried water for hundreds of miles, and how steel and cables later let engineers span whole "
    "bays. She wrote careful notes in a small notebook, underlining the dates she wanted to remember. Outside, "
    "the weather changed twice before noon. Clouds came in from the sea, it rained hard for ten minutes, and "
    "then the sun returned as if nothing had happened. The market opened in the square with apples, cheese, "
    "honey, wool and second-hand books. A man repaired clocks at a folding table, explaining to anyone who "
    "stopped that a good clock needs patience more than tools. Further inland, farmers were cutting hay and "
    "stacking it to dry, talking about prices, the new road and the summer festival. At the station, a train "
    "arrived four minutes late, which in this town counted as an event. Travellers stepped down with heavy "
    "bags, asked for directions to the guest houses, and looked around with the curiosity of people who had "
    "read about a place but never seen it. By evening the lamps were lit along the harbour, the cafes filled "
    "with quiet conversation, and the river carried the last light of the day towards the sea. "
)


@dataclass(frozen=True)
class WorkloadSpec:
    """`fixed`: every request input_len/output_len; `mixed`: each drawn from [min, max] (inclusive)."""

    kind: str  # "fixed" or "mixed"
    num_requests: int
    input_len: tuple[int, int]
    output_len: tuple[int, int]
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "mixed"):
            raise ValueError(f"workload kind must be fixed or mixed, not {self.kind!r}")
        for name, (lo, hi) in (("input_len", self.input_len), ("output_len", self.output_len)):
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} range must satisfy 1 <= min <= max, got {lo}..{hi}")
        fixed_lengths = self.input_len[0] == self.input_len[1] and self.output_len[0] == self.output_len[1]
        if self.kind == "fixed" and not fixed_lengths:
            raise ValueError("a fixed workload has one input and one output length")
        if self.num_requests < 1:
            raise ValueError("num_requests must be >= 1")

    @classmethod
    def fixed(cls, num_requests: int, input_len: int, output_len: int, seed: int = 0) -> WorkloadSpec:
        return cls("fixed", num_requests, (input_len, input_len), (output_len, output_len), seed)


@dataclass(frozen=True)
class BenchRequest:
    index: int
    prompt: str
    input_ids: tuple[int, ...]  # the prompt as the engine tokenizes it
    output_len: int  # tokens to generate (exactly, with ignore_eos)

    @property
    def input_len(self) -> int:
        return len(self.input_ids)


def build_workload(tokenizer: Any, spec: WorkloadSpec) -> list[BenchRequest]:
    rng = random.Random(spec.seed)
    corpus = list(tokenizer(CORPUS, add_special_tokens=False)["input_ids"])
    requests = []
    for index in range(spec.num_requests):
        input_len = rng.randint(*spec.input_len)
        output_len = rng.randint(*spec.output_len)
        prompt, ids = make_prompt(tokenizer, corpus, input_len, rng.randrange(len(corpus)))
        requests.append(BenchRequest(index, prompt, tuple(ids), output_len))
    return requests


def make_prompt(tokenizer: Any, corpus: list[int], length: int, offset: int) -> tuple[str, list[int]]:
    """Text whose tokenization (with special tokens) is `length` tokens long, or as close as the
    tokenizer allows after a few corrections; returns the text and its token ids."""
    specials = len(tokenizer("", add_special_tokens=True)["input_ids"])
    want = max(length - specials, 1)
    stream = corpus * ((offset + 2 * want + 16) // len(corpus) + 1)  # room to extend the window
    window = stream[offset:offset + want]
    best: tuple[str, list[int]] | None = None
    for _ in range(8):
        text = tokenizer.decode(window, skip_special_tokens=True)
        ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
        if best is None or abs(len(ids) - length) < abs(len(best[1]) - length):
            best = (text, ids)
        if len(ids) == length:
            break
        # Merges at the cut change the count: trim or extend the window by the difference and retry.
        delta = length - len(ids)
        window = window[:len(window) + delta] if delta < 0 else stream[offset:offset + len(window) + delta]
        if not window:
            window = stream[offset:offset + 1]
    assert best is not None
    return best
