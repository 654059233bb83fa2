"""Keeps tritonserver serving the model: watches it, and when the model fails, ends it fast and either
starts it again (`--on-model-failure restart`, the default) or makes the launcher exit 1 (`exit`).

Why restarting is the default: the gateway and the front keep the public ports, so clients see 503s for
the ~15-30 s a reload takes instead of refused connections, and one crash (an OOM-killed model process)
needs no orchestrator. Failures that repeat still end the launcher: more than --max-model-restarts in
ten minutes, and it exits 1 as TGI's launcher does on a shard failure, so an orchestrator notices.

A model process (the Python backend stub) that dies takes its in-flight requests with it: tritonserver
would wait for them for --graceful-termination-timeout, and keep answering new ones with errors. So
tritonserver is killed at once (the clients' connections through the gateway then end with an error),
and what only a clean unload removes, the stubs' shared memory and the backend's scratch directory
(python_env.py), is removed here.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tgi_llm.launcher.child import ChildProcess
from tgi_llm.launcher.process import ServerProcess
from tgi_llm.launcher.python_env import env_dirs, new_env_dir, remove_env_dirs
from tgi_llm.launcher.shm import remove_regions, stub_regions
from tgi_llm.procfs import pid_alive

logger = logging.getLogger("tgi_llm.launcher")

POLICIES = ("restart", "exit")
RESTART_WINDOW_S = 600.0
#: A model that fails while it unloads itself gets this long to stop before it is killed.
STOP_GRACE_S = 5.0
#: Hang guard for a reload (the first start has its own, longer one).
RELOAD_TIMEOUT_S = 600.0
POLL_S = 0.2
CHECK_S = 1.0  # how often the model's process and readiness are checked (bounds noticing a death)


class Failed(Exception):
    """The launcher must exit 1 with this message."""


@dataclass
class RestartPolicy:
    on_failure: str = "restart"
    max_restarts: int = 3
    window_s: float = RESTART_WINDOW_S
    _times: deque[float] = field(default_factory=deque)

    def allow(self, now: float) -> bool:
        """Record one more restart if the policy allows it now."""
        if self.on_failure != "restart":
            return False
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
        if len(self._times) >= self.max_restarts:
            return False
        self._times.append(now)
        return True

    def backoff_s(self) -> float:
        """1 s before the first restart in the window, then 2, 4, 8 at most."""
        return min(2.0 ** (len(self._times) - 1), 8.0)


@dataclass(frozen=True)
class _ModelFailure:
    message: str
    process_died: bool  # the stub is gone: nothing graceful is possible any more


class Supervisor:
    def __init__(self, make_server: Callable[[], ServerProcess], ready_url: str, model: str,
                 policy: RestartPolicy) -> None:
        self.make_server = make_server
        self.ready_url = ready_url
        self.model = model
        self.policy = policy
        self.server: ServerProcess | None = None
        self.stopping = False
        self._stop_event = threading.Event()
        self._stub_pids: list[int] = []
        self._regions: list[str] = []
        self._env_dirs: list[Path] = []

    # ---- stop requests (signal handlers) ----
    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def handler(signum: int, _frame: object) -> None:
            logger.info("received %s", signal.Signals(signum).name)
            self.request_stop()

        for sig in previous:
            signal.signal(sig, handler)
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
            self._shutdown_left_over()

    def request_stop(self) -> None:
        """First call: graceful stop (in-flight requests finish); second: kill."""
        second = self.stopping
        self.stopping = True
        self._stop_event.set()
        if self.server is not None:
            if second:
                self.server.kill()
            else:
                self.server.stop()

    def _shutdown_left_over(self) -> None:
        """Leaving early (an exception): never leave tritonserver behind."""
        server = self.server
        if server is not None and server.process is not None and server.process.poll() is None:
            server.stop()
            try:
                server.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                server.kill()
            server.wait()
        self._remove_leftovers()

    # ---- tritonserver's life ----
    def start(self, timeout_s: float | None = None) -> bool:
        """Start tritonserver and wait for the model; False if it failed (or a stop was requested)."""
        self.server = server = self.make_server()
        before = env_dirs()
        server.start()
        if self.stopping:  # a signal came while starting
            server.stop()
        ready = server.wait_ready(self.ready_url, timeout_s=timeout_s)
        if (env_dir := new_env_dir(before)) is not None:
            self._env_dirs.append(env_dir)
        if ready:
            self._stub_pids = server.model_processes(self.model)
            self._regions += stub_regions(self._stub_pids)
            if not self._stub_pids:
                logger.warning("model `%s`'s process not found under tritonserver: its death would go unnoticed",
                               self.model)
        return ready

    def end_failed_start(self) -> int:
        """After start() returned False: stop what is left, return tritonserver's status."""
        assert self.server is not None
        if self.server.process.poll() is None:
            self.server.stop()
        code = self.server.wait()
        self._remove_leftovers()
        return code

    def run(self, children: Sequence[ChildProcess]) -> int:
        """Until a requested stop ends tritonserver (its status is returned); raises Failed otherwise."""
        while True:
            outcome = self._watch(children)
            if isinstance(outcome, int):
                return outcome
            if isinstance(outcome, str):  # a helper process died: fatal whatever the policy
                raise Failed(outcome)
            self._end_model(outcome)
            if not self.policy.allow(time.monotonic()):
                if self.policy.on_failure == "restart":
                    raise Failed(f"{outcome.message}; not restarting: {self.policy.max_restarts} restarts in the "
                                 f"last {self.policy.window_s / 60:.0f} minutes")
                raise Failed(outcome.message)
            if not self._restart():
                if self.stopping:
                    return 0

    def _watch(self, children: Sequence[ChildProcess]) -> int | str | _ModelFailure:
        server = self.server
        assert server is not None and server.process is not None
        next_check = time.monotonic() + CHECK_S
        not_ready = 0
        while server.process.poll() is None:
            if not self.stopping:
                for child in children:
                    if not child.alive():
                        message = f"the {child.name} exited with status {child.process.poll()}"
                        logger.error("%s: stopping tritonserver", message)
                        server.stop()
                        server.wait()
                        self._remove_leftovers()
                        return message
                if server.model_unloaded.is_set():
                    return _ModelFailure(f"model `{self.model}` unloaded itself: its engine or a shard failed", False)
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + CHECK_S
                    # A stub that finalized exits before tritonserver logs the unload: not a crash.
                    if (self._stub_pids and not server.model_finalized.is_set()
                            and not any(pid_alive(p) for p in self._stub_pids)):
                        return _ModelFailure(
                            f"model `{self.model}`'s process (Triton's Python backend stub, pid "
                            f"{', '.join(map(str, self._stub_pids))}) died: killed or crashed", True)
                    # Three answers in a row: one slow answer on a saturated machine is not a failure.
                    not_ready = 0 if server.is_ready(self.ready_url) else not_ready + 1
                    if not_ready >= 3 and server.process.poll() is None:
                        return _ModelFailure(f"model `{self.model}` is no longer ready", False)
            time.sleep(POLL_S)
        code = server.wait()
        self._remove_leftovers()
        if self.stopping:
            return code
        return _ModelFailure(f"tritonserver exited unexpectedly with status {code}", True)

    def _end_model(self, failure: _ModelFailure) -> None:
        server = self.server
        assert server is not None and server.process is not None
        logger.error("%s: %s tritonserver", failure.message,
                     "killing" if failure.process_died else "stopping")
        if failure.process_died:
            server.kill()
        elif server.process.poll() is None:
            server.stop()
            try:
                server.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                server.kill()
        server.wait()
        self._remove_leftovers()

    def _restart(self) -> bool:
        """Back off, start tritonserver again and wait for the model; False if that failed or we stop."""
        delay = self.policy.backoff_s()
        logger.warning("restarting tritonserver in %.0f s (--on-model-failure restart)", delay)
        if self._stop_event.wait(delay) or self.stopping:
            return False
        started = time.monotonic()
        if self.start(timeout_s=RELOAD_TIMEOUT_S):
            logger.info("model `%s` is serving again, %.1f s after the restart began", self.model,
                        time.monotonic() - started)
            return True
        logger.error("tritonserver did not get model `%s` ready again", self.model)
        self.end_failed_start()
        return False

    def _remove_leftovers(self) -> None:
        """What a tritonserver that is gone left: its stubs' shared memory, its Python backend directory."""
        remove_regions(self._regions)
        self._regions = []
        remove_env_dirs(self._env_dirs)
        self._env_dirs = []
