"""Compile a small C source into a shared library with the system compiler, once per machine.

Used by the optional CPU kernels. Everything here runs inside Triton's Python-backend stub, whose
embedded interpreter gets no locale coercion: its default encoding can be ASCII even under a UTF-8
locale, while gcc quotes its diagnostics with UTF-8 characters. So compiler output is read as bytes and
decoded explicitly, and every failure becomes one `NativeBuildError` with the reason, never anything else.

The library is cached under `$TGI_LLM_KERNEL_CACHE` (default `~/.cache/tgi_llm/kernels`), keyed by the
source, the compiler and its version, the flags and the CPU (model name and ISA flags, since the code is
built with -march=native): a cache shared between an AVX2 and an AVX-512 machine never runs foreign code.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

#: -Wno-psabi: the kernels use 64-byte vector types in static inline functions only, so the ABI note gcc
#: prints for them on CPUs without AVX-512 is about a calling convention nothing here uses.
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-Wno-psabi")
COMPILE_TIMEOUT_S = 300


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
    env = os.environ.get("TGI_LLM_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tgi_llm" / "kernels"


def build_library(name: str, source: str, compiler: str | None = None,
                  flags: tuple[str, ...] = BASE_FLAGS) -> Path:
    """The cached shared library for `source`, compiled now if it is not cached yet.

    Compiler warnings are logged once at debug level; a non-zero exit, a missing compiler, a timeout or
    an unwritable cache raise NativeBuildError."""
    compiler = compiler or os.environ.get("CC") or "cc"
    version = compiler_version(compiler)
    key = hashlib.sha256("\0".join([source, compiler, version, *flags, cpu_id()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}_{key}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
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
            os.replace(out, target)  # atomic: concurrent builders (TP ranks, test workers) never see half a file
    except subprocess.TimeoutExpired:
        raise NativeBuildError(f"{compiler} took more than {COMPILE_TIMEOUT_S} s") from None
    except OSError as exc:
        raise NativeBuildError(f"could not build {name} in {target.parent}: {exc}") from None
    logger.info("built %s with %s: %s", name, version or compiler, target)
    return target
