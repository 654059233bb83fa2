"""Compile a small C source into a shared library with the system compiler, once per machine.

Used by the optional CPU kernels. Everything here runs inside Triton's Python-backend stub, whose
embedded interpreter gets no locale coercion: its default encoding can be ASCII even under a UTF-8
locale, while gcc quotes its diagnostics with UTF-8 characters. So compiler output is read as bytes and
decoded explicitly, and every failure becomes one `NativeBuildError` with the reason, never anything else.

The library is cached under `$TGI_LLM_KERNEL_CACHE` (default `~/.cache/tgi_llm/kernels`), keyed by the
source, the compiler and its version, the flags and the CPU (model name and ISA flags, since the code is
built with -march=native): a cache shared between an AVX2 and an AVX-512 machine never runs foreign code.
One process at a time builds a given library (a lock file beside it): the others (the launcher's kernels
step and the model's load, tensor-parallel ranks, test workers) wait for it and then load what it built.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tgi_llm.settings import settings

logger = logging.getLogger(__name__)

#: -Wno-psabi: the kernels use 64-byte vector types in static inline functions only, so the ABI note gcc
#: prints for them on CPUs without AVX-512 is about a calling convention nothing here uses.
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-Wno-psabi")
COMPILE_TIMEOUT_S = 300
#: How long a process waits for another one's build of the same library: its compile is bounded by
#: COMPILE_TIMEOUT_S, so a longer wait means that process is stuck, and the kernels' torch path serves.
LOCK_WAIT_S = COMPILE_TIMEOUT_S + 60


class NativeBuildError(RuntimeError):
    """The library could not be built or found; the message says why (compiler output included)."""


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", errors="replace").strip()


def cpu_id() -> str:
    """What -march=native depends on."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return platform.processor()
    keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(keep))


def compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise NativeBuildError(f"C compiler {compiler!r} not usable: {exc}") from None
    if done.returncode != 0:
        raise NativeBuildError(f"`{compiler} --version` exited with {done.returncode}: {_text(done.stderr)}")
    return _text(done.stdout).splitlines()[0] if done.stdout else ""


def cache_dir() -> Path:
    return settings().kernel_cache


def build_library(name: str, source: str, compiler: str | None = None,
                  flags: tuple[str, ...] = BASE_FLAGS) -> Path:
    """The cached shared library for `source`, compiled now if it is not cached yet (or waited for, while
    another process compiles it).

    Compiler warnings are logged once at debug level; a non-zero exit, a missing compiler, a timeout, an
    unwritable cache or a build of another process that never ends raise NativeBuildError."""
    compiler = compiler or os.environ.get("CC") or "cc"
    version = compiler_version(compiler)
    key = hashlib.sha256("\0".join([source, compiler, version, *flags, cpu_id()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}_{key}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _build_lock(target.with_suffix(".lock"), name):
            if target.exists():  # another process built it while this one waited
                return target
            _compile(name, source, compiler, flags, target)
    except subprocess.TimeoutExpired:
        raise NativeBuildError(f"{compiler} took more than {COMPILE_TIMEOUT_S} s") from None
    except OSError as exc:
        raise NativeBuildError(f"could not build {name} in {target.parent}: {exc}") from None
    logger.info("built %s with %s: %s", name, version or compiler, target)
    return target


def _compile(name: str, source: str, compiler: str, flags: tuple[str, ...], target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(source, encoding="utf-8")
        out = Path(tmp) / target.name
        done = subprocess.run([compiler, *flags, str(src), "-o", str(out)], capture_output=True,
                              timeout=COMPILE_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise NativeBuildError(f"{compiler} exited with {done.returncode}: {_text(done.stderr)[-2000:]}")
        if done.stderr:
            logger.debug("%s printed while building %s: %s", compiler, name, _text(done.stderr)[-2000:])
        os.replace(out, target)  # atomic: a process that did not wait for the lock never sees half a file


@contextlib.contextmanager
def _build_lock(path: Path, name: str) -> Iterator[None]:
    """Held while building one library; released by the kernel when its holder exits, however it exits."""
    with open(path, "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            t0 = time.monotonic()
            logger.info("waiting for %s: another process is building it", name)
            while True:
                time.sleep(0.1)
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() - t0 > LOCK_WAIT_S:
                        raise NativeBuildError(f"another process has been building {name} for more than "
                                               f"{LOCK_WAIT_S} s ({path})") from None
            logger.info("waited %.1f s for %s", time.monotonic() - t0, name)
        yield
