"""How many prompt tokens a step may take while other requests are decoding.

Every running stream waits a whole step for its next token, and a step's time grows with the prompt
tokens it computes. A fixed token budget cannot bound that wait: CPUs differ five-fold in prefill speed
(AVX2 vs AVX-512, one core vs many). So with a step-time target the budget follows the measured cost per
token: target / (seconds per token), never below one block (prompts keep moving) and never above
`max_batch_prefill_tokens`. With nobody decoding there is no one to stall, and the budget is the whole cap
(long prompts prefill at full efficiency).

The cost per token is measured on the whole step (scheduling, forward, streaming the tokens out), since
that is what a decoding stream waits, and it rises as soon as a step shows it rising but falls only
gradually: a long prompt's chunks attend over an ever longer context, so each costs more per token than
the last, and an average that lags behind overshoots the target on every step (measured: 1,500 tokens
under 8 decodes, steps up to 480 ms at a 400 ms target).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Steps this small say little about the cost per token (fixed costs dominate).
MIN_SAMPLE_TOKENS = 32
#: Weight of the newest step in the running average when the cost per token falls.
SMOOTHING = 0.3


@dataclass
class StepPacer:
    target_s: float | None  # None: no pacing
    min_tokens: int = 16
    seconds_per_token: float | None = None

    def observe(self, num_tokens: int, step_s: float) -> None:
        """A finished step: `num_tokens` fed, `step_s` seconds from scheduling it to its tokens sent."""
        if self.target_s is None or num_tokens < MIN_SAMPLE_TOKENS or step_s <= 0:
            return
        sample = step_s / num_tokens
        prev = self.seconds_per_token
        self.seconds_per_token = sample if prev is None or sample > prev else prev + SMOOTHING * (sample - prev)

    def budget(self, cap: int, decoding: bool) -> int:
        """Tokens the next step may feed (decodes included)."""
        if not decoding or self.target_s is None or self.seconds_per_token is None:
            return cap
        return max(min(cap, int(self.target_s / self.seconds_per_token)), min(self.min_tokens, cap))
