"""How many tokens each sequence guesses: its own recent acceptance against what an extra row costs.

A step of `rows` rows (one per decode, plus every draft) costs about t0 + t1 * rows: t0 is reading the
weights and the step's fixed costs, t1 a row's arithmetic and its attention. B sequences that guess D
tokens and have A of them accepted make B + A tokens in t0 + t1 * (B + D) instead of B in t0 + t1 * B,
which is a gain exactly when the acceptance rate A / D exceeds

    B * t1 / (t0 + t1 * B)

(DraftLength of a step, `SpeculationPolicy.break_even`). At one stream on a CPU t1 is a small fraction
of t0 and nearly any guess pays; at 32 streams the step is mostly rows, so only sequences whose guesses
are nearly always right keep guessing. t0 and t1 are fitted to the steps the engine measures (steps
without prompt chunks, whose rows vary with the drafts), starting from a prior that an extra row costs
1/8 of a one-row step, and following the machine from there.
"""

from __future__ import annotations

from dataclasses import dataclass

#: --speculate as the launcher and the model repository serve it: no workload measured lost by it, input-
#: grounded ones gained most (docs/PERFORMANCE.md). LimitOptions (the Python API) leaves it off.
SERVED_SPECULATE = 4
#: Before any measurement: an extra row costs this fraction of a one-row step.
PRIOR_ROW_COST = 1.0 / 8.0
#: Weight of the prior in the fit, in steps; and how much older steps count at each new one.
PRIOR_WEIGHT = 4.0
DECAY = 0.98
#: A sequence's acceptance rate before it has guessed, and how fast a rate follows new steps.
PRIOR_ACCEPTANCE = 0.5
SMOOTHING = 0.3
#: While a sequence does not guess, its rate moves back toward the prior this much per step, so a
#: sequence that stopped guessing in one part of its answer tries again later.
RECOVERY = 0.05


@dataclass
class DraftLength:
    """One sequence's guessing: how many tokens next time, and how often its guesses were accepted."""

    limit: int
    current: int = 0
    acceptance: float = PRIOR_ACCEPTANCE

    def __post_init__(self) -> None:
        self.current = self.current or self.limit

    def observe(self, drafted: int, accepted: int) -> None:
        """A verified step: all accepted, guess one more next time; else as many as were accepted, plus one."""
        if drafted <= 0:
            return
        self.acceptance += SMOOTHING * (accepted / drafted - self.acceptance)
        self.current = min(self.limit, self.current + 1) if accepted == drafted else max(1, accepted + 1)

    def skipped(self) -> None:
        """A step in which the sequence did not guess."""
        self.acceptance += RECOVERY * (PRIOR_ACCEPTANCE - self.acceptance)


@dataclass
class SpeculationPolicy:
    limit: int  # --speculate: the most tokens one sequence guesses per step
    # Exponentially weighted sums over measured steps (rows x, seconds y) for the fit y = t0 + t1 x.
    _w: float = 0.0
    _x: float = 0.0
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def observe(self, rows: int, seconds: float) -> None:
        """A step without prompt chunks: `rows` rows (decodes and drafts) took `seconds`."""
        if rows <= 0 or seconds <= 0:
            return
        self._w, self._x, self._y = DECAY * self._w + 1, DECAY * self._x + rows, DECAY * self._y + seconds
        self._xx, self._xy = DECAY * self._xx + rows * rows, DECAY * self._xy + rows * seconds

    def row_cost(self) -> tuple[float, float]:
        """(t0, t1) in seconds, or in units of a one-row step before any measurement."""
        if self._w == 0:
            return 1.0 - PRIOR_ROW_COST, PRIOR_ROW_COST
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mean_x * mean_x
        cov = self._xy / self._w - mean_x * mean_y
        # Ridge toward the prior slope (as a fraction of the mean step), so steps of equal size still fit.
        prior_slope = PRIOR_ROW_COST * mean_y / max(mean_x * PRIOR_ROW_COST + 1 - PRIOR_ROW_COST, 1e-9)
        k = PRIOR_WEIGHT / self._w
        t1 = max((cov + k * prior_slope) / (var + k), 0.0)
        t0 = max(mean_y - t1 * mean_x, 1e-6)
        return t0, t1

    def break_even(self, batch: int) -> float:
        """The acceptance rate a draft token needs to pay for its row in a step of `batch` sequences."""
        t0, t1 = self.row_cost()
        return batch * t1 / (t0 + t1 * batch)
