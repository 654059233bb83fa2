"""Which waiting request a step admits next (chunked prefill, `--scheduling-policy`): first come first
served, or the shortest prompt first with ageing (the default).

On a CPU a prompt's prefill is compute-bound, so a burst of requests waits for the prompts admitted before
it; when the shortest prompts go first, more requests see their first token sooner (shortest job first
minimises the mean wait) while the last of a burst finishes when it would anyway. Ageing bounds what a
long prompt gives up: requests are ordered by their estimated prefill time minus the time they have
waited, both in seconds, so a request that arrived `g` seconds after another overtakes it only if its
prefill is shorter by more than `g`. Nothing that arrives after a request has waited out its own prefill
time gets ahead of it. The prefill time is the pacer's measured cost per prompt token (pacing.py); before
that is known, the order is arrival.
"""

from __future__ import annotations

from collections.abc import Iterable

from tgi_llm.engine.limits import FCFS
from tgi_llm.engine.sequence import Sequence


def admission_order(waiting: Iterable[Sequence], policy: str, seconds_per_token: float | None,
                    now: float) -> list[Sequence]:
    """`waiting` (in arrival order) in the order to admit them under `policy` (limits.SCHEDULING_POLICIES);
    a stable sort, so ties keep arrival order."""
    queue = list(waiting)
    if policy == FCFS or seconds_per_token is None or len(queue) < 2:
        return queue
    return sorted(queue, key=lambda s: s.input_length * seconds_per_token - (now - s.queued_at))
