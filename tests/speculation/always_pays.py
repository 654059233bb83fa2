"""A speculation policy for tests of what guessing does, not of when it guesses."""

from __future__ import annotations

from tgi_llm.speculation import SpeculationPolicy


class AlwaysPays(SpeculationPolicy):
    """Guess whenever the proposer has a guess, whatever the batch and the measured step times. The engine
    fits the step cost to measured (in tests: noisy) step times, and under the prior no stream guesses in a
    batch of 7 or more; pinned, which steps guess does not depend on timing. The real policy is tested in
    tests/speculation/test_policy.py, with the scheduler, and where a test says it runs the fitted one."""

    def observe(self, rows: int, seconds: float) -> None:
        pass

    def break_even(self, batch: int) -> float:
        return 0.0
