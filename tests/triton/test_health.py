import threading

from tgi_llm.triton.health import HealthWatchdog


def test_fires_once_when_the_engine_turns_unhealthy():
    healthy = threading.Event()
    healthy.set()
    fired = []
    done = threading.Event()
    dog = HealthWatchdog(healthy.is_set, lambda: (fired.append(1), done.set()), poll_s=0.01)
    dog.start()
    assert not done.wait(0.1)  # healthy: nothing happens
    healthy.clear()
    assert done.wait(5)
    dog.stop()
    assert fired == [1]


def test_stop_before_failure_never_fires():
    fired = []
    dog = HealthWatchdog(lambda: True, lambda: fired.append(1), poll_s=0.01)
    dog.start()
    dog.stop()
    assert fired == []
