"""Compile the C sources of tgi_llm/csrc into one shared library with the system compiler, once per machine.

Everything here runs inside Triton's Python-backend stub, whose embedded interpreter gets no locale
coercion: its default encoding can be ASCII even under a UTF-8 locale, while gcc quotes its diagnostics
with UTF-8 characters. So compiler output is read as bytes and decoded explicitly, and every failure
becomes one `NativeBuildError` with the reason, never anything else.

Each translation unit is compiled on its own, in place (so a diagnostic names the real file and line), with
its own extra flags where it needs them, all at once (the cores of a first start are otherwise idle), and
then linked. The build lives in a directory of its own under `settings().kernel_cache`, beside the
`compile_commands.json` that editors and clang-tidy read, keyed by every source and header, the units and
their flags, the compiler and its version and the CPU (model name and ISA flags, since the code is built with
-march=native): a cache shared between an AVX2 and an AVX-512 machine never runs foreign code. One process
at a time builds a given library (a lock file beside it): the others (the launcher's kernels step and the
model's load, tensor-parallel ranks, test workers) wait for it and then load what it built.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tgi_llm.settings import settings

logger = logging.getLogger(__name__)

#: The C sources shipped with the package (package data).
SOURCE_ROOT = Path(__file__).resolve().parent.parent / "csrc"
#: -Wno-psabi: the kernels use 64-byte vector types in static inline functions only, so the ABI note gcc
#: prints for them on CPUs without AVX-512 is about a calling convention nothing here uses.
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-std=gnu11", "-Wall", "-Wextra", "-Wno-psabi")
LINK_FLAGS = ("-shared", "-fopenmp", "-lm")
COMPILE_TIMEOUT_S = 300
#: How long a process waits for another one's build of the same library: its compile is bounded by
#: COMPILE_TIMEOUT_S, so a longer wait means that process is stuck, and the kernels' torch path serves.
LOCK_WAIT_S = COMPILE_TIMEOUT_S + 60


@dataclass(frozen=True)
class Unit:
    """One translation unit: its path under the source root and the flags only it takes."""

    source: str
    flags: tuple[str, ...] = ()

    @property
    def object_name(self) -> str:
        return self.source.replace("/", "_").removesuffix(".c") + ".o"


#: The kernels library. One shared object, so that the layer stack calls the linears and attention directly.
#: The layer stack contracts no a*b + c*d into an FMA: its rope and norms round like torch's separate ops.
UNITS = (Unit("quant/linear.c"), Unit("attention/paged.c"),
         Unit("layer_stack/layer_stack.c", ("-ffp-contract=off",)),
         Unit("layer_stack/experts.c", ("-ffp-contract=off",)), Unit("lora/lora.c"), Unit("abi.c"))


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


def sources_digest(root: Path) -> str:
    """Every C source and header under `root`, names and contents."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".c", ".h")):
        digest.update(f"{path.relative_to(root)}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def build_library(name: str, root: Path = SOURCE_ROOT, units: Sequence[Unit] = UNITS, compiler: str | None = None,
                  flags: tuple[str, ...] = BASE_FLAGS) -> Path:
    """The cached shared library of `units` (paths under `root`, whose include/ is on the include path),
    compiled now if it is not cached yet (or waited for, while another process compiles it).

    Compiler warnings are logged as warnings (the sources compile without any); a non-zero exit, a missing
    compiler, a timeout, an unwritable cache or a build of another process that never ends raise
    NativeBuildError."""
    compiler = compiler or os.environ.get("CC") or "cc"
    version = compiler_version(compiler)
    parts = [sources_digest(root), *(f"{u.source} {' '.join(u.flags)}" for u in units), compiler, version, *flags,
             cpu_id()]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    build_dir = cache_dir() / f"{name}_{key}"
    target = build_dir / f"lib{name}.so"
    if target.exists():
        return target
    try:
        build_dir.parent.mkdir(parents=True, exist_ok=True)
        with _build_lock(build_dir.with_suffix(".lock"), name):
            if target.exists():  # another process built it while this one waited
                return target
            _compile(name, root, units, compiler, flags, build_dir)
    except subprocess.TimeoutExpired:
        raise NativeBuildError(f"{compiler} took more than {COMPILE_TIMEOUT_S} s") from None
    except OSError as exc:
        raise NativeBuildError(f"could not build {name} in {build_dir.parent}: {exc}") from None
    logger.info("built %s with %s: %s", name, version or compiler, target)
    return target


def _compile_command(root: Path, unit: Unit, compiler: str, flags: tuple[str, ...], out_dir: Path) -> list[str]:
    return [compiler, *flags, *unit.flags, "-I", str(root / "include"), "-c", str(root / unit.source), "-o",
            str(out_dir / unit.object_name)]


def _compile(name: str, root: Path, units: Sequence[Unit], compiler: str, flags: tuple[str, ...],
             build_dir: Path) -> None:
    """Compile every unit at once into a temporary directory, link, and move the directory into place."""
    with tempfile.TemporaryDirectory(dir=build_dir.parent) as tmp:
        work = Path(tmp) / build_dir.name
        work.mkdir()
        commands = [_compile_command(root, u, compiler, flags, work) for u in units]
        _run_all(name, commands)
        _run_all(name, [[compiler, *(str(work / u.object_name) for u in units), *LINK_FLAGS, "-o",
                         str(work / f"lib{name}.so")]])
        entries = [{"directory": str(root), "file": str(root / u.source),
                    "arguments": _compile_command(root, u, compiler, flags, build_dir),
                    "output": str(build_dir / u.object_name)} for u in units]
        (work / "compile_commands.json").write_text(json.dumps(entries, indent=1), encoding="utf-8")
        if build_dir.exists():  # a partial build of an earlier process that died: the lock is ours now
            shutil.rmtree(build_dir)
        os.replace(work, build_dir)  # atomic: a process that did not wait for the lock never sees half a build


def _run_all(name: str, commands: list[list[str]]) -> None:
    """Run the commands side by side; the first failure (in command order) is the error. A timeout or an
    exception here (a SIGTERM's SystemExit) kills the compilers still running."""
    procs: list[subprocess.Popen] = []
    try:
        for c in commands:  # each kept as it starts: a SIGTERM between two starts still kills the first
            procs.append(subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        deadline = time.monotonic() + COMPILE_TIMEOUT_S
        errors = [p.communicate(timeout=max(0.0, deadline - time.monotonic()))[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for cmd, proc, err in zip(commands, procs, errors, strict=True):
        if proc.returncode != 0:
            raise NativeBuildError(f"{cmd[0]} exited with {proc.returncode}: {_text(err)[-2000:]}")
    for err in errors:
        if err:
            logger.warning("the compiler printed while building %s: %s", name, _text(err)[-2000:])


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
