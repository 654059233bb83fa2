"""A helper process of the launcher (the gateway, the HTTP front): started in its own session, told to
die with the launcher, stopped with SIGTERM and then SIGKILL."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable

from tgi_llm.launcher.process import ServerProcess, _die_with_parent

logger = logging.getLogger("tgi_llm.launcher")


def env_with_api_key(api_key: str | None) -> dict[str, str]:
    """This environment, plus API_KEY for the gateway and the front: not on a command line where `ps` shows it."""
    env = dict(os.environ)
    if api_key:
        env["API_KEY"] = api_key
    else:
        env.pop("API_KEY", None)
    return env


class ChildProcess:
    def __init__(self, name: str, command: list[str], env: dict[str, str], stop_timeout_s: float) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.stop_timeout_s = stop_timeout_s
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, env=self.env, start_new_session=True,
                                        preexec_fn=_die_with_parent)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, url: str, timeout_s: float = 120.0, expect_status: int = 200,
                   give_up: Callable[[], bool] = lambda: False) -> bool:
        """True once `url` answers `expect_status` (any answer at all when 0); False if the process exits,
        `timeout_s` passes or `give_up()` turns true first."""
        deadline = time.monotonic() + timeout_s
        while self.alive() and time.monotonic() < deadline and not give_up():
            if ServerProcess.answers(url, expect_status):
                return True
            time.sleep(0.1)
        return False

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM) without waiting: several children then stop at the same time."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("the %s did not stop in %.0f s: killing it", self.name, self.stop_timeout_s)
                self.process.kill()
        return self.process.wait()
