"""The restart policy: bounded restarts in a window, with back-off."""

from __future__ import annotations

from tgi_llm.launcher.supervisor import RestartPolicy


def test_restarts_are_bounded_in_the_window_and_back_off():
    policy = RestartPolicy("restart", max_restarts=3, window_s=600)
    delays = []
    for t in (0, 10, 20):
        assert policy.allow(t)
        delays.append(policy.backoff_s())
    assert delays == [1.0, 2.0, 4.0]
    assert not policy.allow(30)  # a fourth failure within ten minutes: give up
    assert policy.allow(611)  # the first restart has left the window


def test_exit_policy_never_restarts():
    assert not RestartPolicy("exit").allow(0)
    assert not RestartPolicy("restart", max_restarts=0).allow(0)
