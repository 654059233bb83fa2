"""What /proc says about other processes (Linux; elsewhere nothing is found and nothing is alive)."""

from __future__ import annotations

from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces and parentheses)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace").rsplit(")", 1)[-1].split()
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")  # a zombie has exited


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None else None


def children(pid: int) -> list[int]:
    """Live processes whose parent is `pid`."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    return [int(e.name) for e in proc.iterdir() if e.name.isdigit() and parent_pid(int(e.name)) == pid
            and pid_alive(int(e.name))]


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]
