"""How many prompt tokens a step may take while other requests are decoding.

Every running stream waits a whole step for its next token, and a step's time grows with the prompt
tokens it computes. A fixed token budget cannot bound that wait: CPUs differ five-fold in prefill speed
(AVX2 vs AVX-512, one core vs many). So with a step-time target the budget follows measured costs: a step
costs what decoding alone costs (the latest steps without prompt tokens) plus a cost per prompt token, and
the prompt budget is (target - decoding) / (cost per prompt token), never below one block (prompts keep
moving) and never above `max_batch_prefill_tokens`. With nobody decoding there is no one to stall, and the
budget is the whole cap (long prompts prefill at full efficiency).

Splitting the two matters: one cost per token over the whole step charged the decodes' fixed share to the
prompt tokens, most of all after a small chunk (15 decodes + 29 prompt tokens: 131 ms, "4.5 ms per token"),
so the next steps took ~100 tokens where ~170 fit; served W2 steps averaged 246 ms against a 300 ms target.

Costs are measured on the whole step (scheduling, forward, streaming the tokens out), since that is what a
decoding stream waits. The cost per prompt token rises as soon as a full-sized step shows it rising but
falls only gradually: a long prompt's chunks attend over an ever longer context, so each costs more per
token than the last, and an average that lags behind overshoots the target on every step (measured: 1,500
tokens under 8 decodes, steps up to 480 ms at a 400 ms target). A small chunk (the tail of a prompt) moves
the average only gradually either way: fixed costs weigh more in it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Steps with fewer prompt tokens say little about the cost per token (fixed costs dominate).
MIN_SAMPLE_TOKENS = 32
#: Weight of the newest step in a running average that moves gradually.
SMOOTHING = 0.3


@dataclass
class StepPacer:
    target_s: float | None  # None: no pacing
    min_tokens: int = 16
    #: What a step without prompt tokens took lately (its decodes, sampling, streaming).
    decode_step_s: float = 0.0
    #: What each prompt token adds to a step.
    seconds_per_token: float | None = None
    #: The last prompt budget given while streams decoded: a step near it is a full-sized sample.
    last_budget: int = 0

    def observe(self, num_tokens: int, num_decodes: int, step_s: float) -> None:
        """A finished step: `num_tokens` fed, `num_decodes` of them decodes, `step_s` seconds from scheduling
        it to its tokens sent."""
        if self.target_s is None or step_s <= 0:
            return
        prompt = num_tokens - num_decodes
        if prompt == 0:
            prev = self.decode_step_s
            self.decode_step_s = step_s if prev == 0.0 else prev + SMOOTHING * (step_s - prev)
            return
        if prompt < MIN_SAMPLE_TOKENS:
            return
        base = self.decode_step_s if num_decodes else 0.0
        sample = max(step_s - base, step_s / 2) / prompt  # a decode base measured high cannot zero the cost
        prev = self.seconds_per_token
        full_sized = prompt >= self.last_budget // 2
        if prev is None or (sample > prev and full_sized):
            self.seconds_per_token = sample
        else:
            self.seconds_per_token = prev + SMOOTHING * (sample - prev)

    def prompt_budget(self, cap: int, decoding: bool) -> int:
        """Prompt tokens the next step may feed, `cap` at most (what remains of the step's token cap)."""
        if not decoding or self.target_s is None or self.seconds_per_token is None:
            return cap
        room = max(self.target_s - self.decode_step_s, 0.0)
        self.last_budget = max(min(cap, int(room / self.seconds_per_token)), min(self.min_tokens, cap))
        return self.last_budget
