"""How many prompt tokens a step may take while other requests are decoding.

Every running stream waits a whole step for its next token, and a step's time grows with the prompt
tokens it computes. A fixed token budget cannot bound that wait, because CPUs differ several-fold in
prefill speed. So the budget follows measured costs, against a step-time target:

    budget = (target - cost of the decodes) / cost per prompt token

never below one block (prompts keep moving) and never above `max_batch_prefill_tokens`. With nobody
decoding there is no one to stall, and the budget is the whole cap.

Why it is built this way:

- Decodes and prompt tokens are costed separately. One cost per token over the whole step would charge
  the decodes' fixed share to the prompt tokens and shrink the next steps.
- Costs are measured on the whole step (scheduling, forward, streaming the tokens out): that is what a
  decoding stream waits.
- The cost per work unit is the median of the latest `COST_SAMPLES` steps. On a shared host one step in a
  few is slowed from outside, and a running average that took such a sample at once shrank the next
  steps for nothing (`tools/pacer_replay.py` replays a served trace to compare estimators).
- Costs are counted in work units: a token at context c is 1 + context_weight * c units, where
  `context_weight` is attention's cost per token of context over a token's linears (from the model's
  shape). Later chunks of a long prompt attend to more tokens and cost more per token; counting work
  sizes each chunk for what it costs, and a long prompt's last chunks do not shrink the next prompt's.
- Until a step of decodes alone has been seen, the first samples charge the decodes' cost to the prompt
  tokens, so they only overstate. The first sample from a full-sized step whose decodes' cost is known
  replaces them all.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

#: Steps with fewer prompt tokens say little about the cost per token (fixed costs dominate).
MIN_SAMPLE_TOKENS = 32
#: Weight of the newest step in the running average of what decoding alone costs.
SMOOTHING = 0.3
#: How many of the latest samples the cost per work unit is the median of.
COST_SAMPLES = 3


def chunk_work(context: int, tokens: int, weight: float) -> float:
    """A prompt chunk's cost in work units: its tokens, each also attending to the `context` before the
    chunk and to half the chunk itself on average."""
    return tokens * (1.0 + weight * (context + tokens / 2))


def tokens_within(work: float, context: int, weight: float) -> int:
    """The most tokens a chunk starting at `context` may take for `work` units (chunk_work inverted)."""
    if work <= 0:
        return 0
    if weight <= 0:
        return int(work)
    linear = 1.0 + weight * context  # work = linear * n + weight / 2 * n^2
    return int((math.sqrt(linear * linear + 2.0 * weight * work) - linear) / weight + 1e-9)


@dataclass
class StepBudget:
    """What one step may still give prompt chunks: tokens (the step's cap) and, while streams decode, work."""

    tokens: int
    work: float | None = None  # None: not paced
    context_weight: float = 0.0
    floor: int = 0  # tokens given whatever they cost: prompts always move

    def take(self, context: int, pending: int) -> int:
        """Tokens for a chunk of `pending` starting at `context`, taken from the budget."""
        n = min(pending, self.tokens)
        if self.work is not None:
            n = min(n, max(tokens_within(self.work, context, self.context_weight), self.floor))
            self.work -= chunk_work(context, n, self.context_weight)
        self.floor = max(self.floor - n, 0)
        self.tokens -= n
        return n

    @property
    def exhausted(self) -> bool:
        return self.tokens <= 0 or (self.floor == 0 and self.work is not None and self.work < 1.0)


@dataclass
class StepPacer:
    target_s: float | None  # None: no pacing
    min_tokens: int = 16
    #: Attention's cost per token of context, in units of a token's linears (0: every token alike).
    context_weight: float = 0.0
    #: What a step without prompt tokens took lately (its decodes, sampling, streaming).
    decode_step_s: float = 0.0
    #: What each work unit of prompt (a token at context 0) adds to a step: the median of `samples`.
    seconds_per_token: float | None = None
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=COST_SAMPLES))
    #: The last prompt budget (work units) given while streams decoded: a step near it is a full-sized sample.
    last_budget: float = 0
    #: Whether the samples come from a full-sized step whose decodes' cost was known and after (before it
    #: they counted the decodes, or a step's fixed costs, as prompt tokens).
    calibrated: bool = False

    def observe(self, num_tokens: int, num_decodes: int, step_s: float,
                chunks: Sequence[tuple[int, int]] = ()) -> None:
        """A finished step: `num_tokens` fed, `num_decodes` of them decodes, `step_s` seconds from scheduling
        it to its tokens sent; `chunks` are its prompt chunks as (context, tokens)."""
        if self.target_s is None or step_s <= 0:
            return
        prompt = num_tokens - num_decodes
        if prompt == 0:
            prev = self.decode_step_s
            self.decode_step_s = step_s if prev == 0.0 else prev + SMOOTHING * (step_s - prev)
            return
        if prompt < MIN_SAMPLE_TOKENS:
            return
        work = sum(chunk_work(c, n, self.context_weight) for c, n in chunks) if chunks else float(prompt)
        base = self.decode_step_s if num_decodes else 0.0
        sample = max(step_s - base, step_s / 2) / work  # a decode base measured high cannot zero the cost
        full_sized = work >= self.last_budget / 2
        if full_sized and num_decodes > 0 and self.decode_step_s > 0 and not self.calibrated:
            self.samples.clear()
            self.calibrated = True
        self.samples.append(sample)
        self.seconds_per_token = statistics.median(self.samples)

    def step_budget(self, cap: int, decoding: bool, floor: int) -> StepBudget:
        """What the next step may give prompt chunks: `cap` tokens (what remains of the step's token cap),
        and while streams decode the work that fits the target; `floor` tokens whatever they cost."""
        if not decoding or self.target_s is None or self.seconds_per_token is None:
            return StepBudget(max(cap, floor), floor=floor)
        room = max(self.target_s - self.decode_step_s, 0.0)
        self.last_budget = room / self.seconds_per_token
        return StepBudget(max(cap, floor), self.last_budget, self.context_weight, floor)
