"""What the soak reads from the server: its Prometheus metrics and its model process's resident memory."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from tgi_llm.procfs import children, cmdline

_LINE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Metrics = dict[tuple[str, frozenset], float]


def read_metrics(url: str) -> Metrics:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: Metrics = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out[(m.group(1), frozenset(_LABEL.findall(m.group(2) or "")))] = float(m.group(3))
    return out


def metric(snapshot: Metrics, name: str, **labels: str) -> float:
    return snapshot.get((name, frozenset(labels.items())), 0.0)


def failures(snapshot: Metrics) -> dict[str, float]:
    """tgi_request_failure by its `err` label."""
    return {dict(labels)["err"]: value for (name, labels), value in snapshot.items()
            if name == "tgi_request_failure" and "err" in dict(labels)}


def model_process(launcher_pid: int) -> int | None:
    """The Python backend stub running tgi_llm under this launcher's tritonserver."""
    for triton in children(launcher_pid):
        argv = cmdline(triton)
        if argv and argv[0].endswith("/tritonserver"):
            for pid in children(triton):
                stub = cmdline(pid)
                if stub and stub[0].endswith("triton_python_backend_stub") and any(
                        a.startswith("tgi_llm_") for a in stub[1:]):
                    return pid
    return None


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
