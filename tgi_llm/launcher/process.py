"""tritonserver as a child process: start, wait for readiness, forward SIGINT/SIGTERM once for a
graceful stop (a second signal kills it), optionally re-emit its log lines as JSON."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from tgi_llm.launcher.logs import json_line
from tgi_llm.procfs import children, cmdline

logger = logging.getLogger("tgi_llm.launcher")

_TRITON_LEVELS = {"I": "INFO", "W": "WARN", "E": "ERROR", "V": "DEBUG"}

#: The Python backend runs each model instance in a child process of tritonserver with this name.
STUB_BINARY = "triton_python_backend_stub"


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the launcher dies without stopping us (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def triton_line_as_json(line: str) -> str:
    """Triton logs `I1122 16:31:12.047 3948 file.cc:12] "message"`; our stub's own lines are JSON already."""
    text = line.rstrip("\n")
    if text.startswith("{"):
        return text
    level = _TRITON_LEVELS.get(text[:1], "INFO") if text[1:2].isdigit() else "INFO"
    return json_line(text, level)


_LOAD_FAILURE = re.compile(r"failed to load '[^']+' version \d+: (.*)")


def unloaded_pattern(model: str) -> re.Pattern[str]:
    """tritonserver's log line for `model` (and no other) leaving service."""
    return re.compile(rf"successfully unloaded '{re.escape(model)}' version \d+")


def reports_model_finalized(line: str) -> bool:
    """Our model's own last log line (tgi_llm/triton/model.py), plain or JSON: its stub exits next."""
    return "tgi_llm.triton" in line and "model finalized" in line


def load_failure(line: str) -> str | None:
    """The reason in `failed to load 'tgi_llm' version 1: Internal: ValueError: ...` (first line only)."""
    match = _LOAD_FAILURE.search(line)
    if match is None:
        return None
    return match.group(1).split("\\n")[0].strip().rstrip('"')


def runs_instance_of(argv: list[str], model: str) -> bool:
    """`<model>_<n>_<device>` exactly: `tgi_llm_trtllm_0_0` is another model's instance, not `tgi_llm`'s."""
    instance = re.compile(rf"^{re.escape(model)}_\d+(_\w+)?$")
    return bool(argv) and argv[0].rsplit("/", 1)[-1] == STUB_BINARY and any(instance.match(a) for a in argv[1:])


class ServerProcess:
    def __init__(self, command: Sequence[str], env: dict[str, str], json_output: bool = False,
                 model: str = "tgi_llm", redact: Sequence[str] = ()) -> None:
        self.command = list(command)
        self.env = env
        self.json_output = json_output
        self.model = model
        self._unloaded = unloaded_pattern(model)
        self._redact = [r for r in redact if r]  # secrets tritonserver may echo (its command line)
        self.process: subprocess.Popen | None = None
        self.stop_requested = False
        self._term_sent = False  # SIGTERM sent: a further stop signal kills
        self.load_error: str | None = None  # why the model failed to load, from tritonserver's log
        #: The model unloaded itself (its engine or a shard died): it will not be ready again. Read from the
        #: log, so it is seen even when the model was ready too briefly for a readiness poll to notice.
        self.model_unloaded = threading.Event()
        #: The model finalized itself: its stub's exit that follows is an unload, not a crash.
        self.model_finalized = threading.Event()
        self._pump: threading.Thread | None = None

    def start(self) -> None:
        # Piped (not inherited) so a load failure's reason can be quoted in the launcher's own error.
        self.process = subprocess.Popen(
            self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            encoding="utf-8", errors="replace",
            start_new_session=True,  # a terminal's Ctrl-C reaches only us; we forward it once
            preexec_fn=_die_with_parent,
        )
        self._pump = threading.Thread(target=self._pump_lines, name="tritonserver-log", daemon=True)
        self._pump.start()

    def _pump_lines(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            reason = load_failure(line)
            if reason and self.load_error is None:
                self.load_error = reason
            if self._unloaded.search(line):
                self.model_unloaded.set()
            elif reports_model_finalized(line):
                self.model_finalized.set()
            for secret in self._redact:
                line = line.replace(secret, "***")
            print(triton_line_as_json(line) if self.json_output else line.rstrip("\n"), file=sys.stderr, flush=True)

    def wait_ready(self, url: str, poll_s: float = 0.5, timeout_s: float | None = None) -> bool:
        """True once `url` answers 200; False if the server exits, a stop is requested, the model unloads or
        `timeout_s` passes first."""
        assert self.process is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.process.poll() is None and not self.stop_requested and not self.model_unloaded.is_set():
            if self.is_ready(url):
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(poll_s)
        return False

    def model_processes(self, model: str) -> list[int]:
        """The Python backend stubs running `model`'s instances (named `<model>_<n>_<device>` on their
        command line): the processes our engine lives in."""
        assert self.process is not None
        return [pid for pid in children(self.process.pid) if runs_instance_of(cmdline(pid), model)]

    @staticmethod
    def is_ready(url: str) -> bool:
        return ServerProcess.answers(url, 200)

    @staticmethod
    def answers(url: str, status: int = 200) -> bool:
        """`url` answers with `status` (with anything at all when 0)."""
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return status in (0, response.status)
        except urllib.error.HTTPError as exc:
            return status in (0, exc.code)
        except (urllib.error.URLError, OSError):
            return False

    def wait(self) -> int:
        assert self.process is not None
        while True:
            try:
                code = self.process.wait()
                break
            except KeyboardInterrupt:  # only if our handler is not installed
                self.request_stop()
        if self._pump is not None:
            self._pump.join(timeout=5)
        return code

    def kill(self) -> None:
        """SIGKILL tritonserver and everything in its session (the stubs, their shard ranks): for a server
        whose model process died, where in-flight requests can never finish and a graceful stop would
        wait them out for --graceful-termination-timeout. Also once tritonserver itself has died: a crash
        (SIGSEGV) leaves its stubs running, reparented to init, each holding a model's memory."""
        if self.process is None:
            return
        self.stop_requested = True
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the group outlives its leader while members remain
        except OSError:  # no one left in the group
            if self.process.poll() is None:
                self.process.kill()

    def request_stop(self) -> None:
        """A stop signal: the first stops tritonserver gracefully, a second one kills it."""
        if self._term_sent and self.process is not None and self.process.poll() is None:
            logger.warning("second stop signal: killing tritonserver")
            self.process.kill()
            return
        self.stop()

    def stop(self) -> None:
        """Ask tritonserver to stop gracefully (in-flight requests finish), once: asking again is not a kill
        (only a second stop signal is). Before start(), the start sends it."""
        self.stop_requested = True
        if self._term_sent or self.process is None or self.process.poll() is not None:
            return
        self._term_sent = True
        logger.info("stopping tritonserver (in-flight requests finish first; signal again to kill)")
        self.process.send_signal(signal.SIGTERM)
