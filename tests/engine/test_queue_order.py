"""Which waiting request is admitted next: arrival order, or the shortest prompt first with ageing."""

from __future__ import annotations

from tests.engine.test_scheduler import make_seq
from tgi_llm.engine.queue_order import admission_order


def queued(input_len: int, at: float):
    seq = make_seq(input_len, 4)
    seq.queued_at = at
    return seq


def test_fcfs_keeps_arrival_order():
    a, b = queued(400, 0.0), queued(50, 0.1)
    assert admission_order([a, b], "fcfs", 0.001, now=1.0) == [a, b]


def test_shorter_prompts_go_first_once_the_cost_per_token_is_known():
    a, b, c = queued(400, 0.0), queued(50, 0.0), queued(200, 0.0)
    assert admission_order([a, b, c], "shortest-prompt", 0.001, now=0.1) == [b, c, a]
    assert admission_order([a, b, c], "shortest-prompt", None, now=0.1) == [a, b, c]  # nothing measured: arrival


def test_a_request_is_overtaken_only_by_one_shorter_by_more_than_the_gap_between_their_arrivals():
    # 1 ms per token: the 400-token prompt is 0.4 s of prefill.
    old = queued(400, 0.0)
    much_shorter_soon = queued(100, 0.2)  # 0.3 s shorter, 0.2 s later: goes first
    assert admission_order([old, much_shorter_soon], "shortest-prompt", 0.001, now=0.5)[0] is much_shorter_soon
    shorter_late = queued(100, 0.35)  # 0.3 s shorter but 0.35 s later: waits its turn
    assert admission_order([old, shorter_late], "shortest-prompt", 0.001, now=0.5)[0] is old
    # Nothing that arrives after the old request has waited its own prefill time gets ahead of it.
    assert admission_order([old, queued(1, 0.41)], "shortest-prompt", 0.001, now=5.0)[0] is old


def test_equal_prompts_keep_arrival_order():
    a, b = queued(64, 0.0), queued(64, 0.0)
    assert admission_order([a, b], "shortest-prompt", 0.001, now=0.0) == [a, b]
