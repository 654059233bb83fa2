"""Building the optional C kernels: locale-independent, cached per CPU, every failure one clear error."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tgi_llm import native_build
from tgi_llm.attention.cpu_kernels import _SOURCE
from tgi_llm.native_build import BASE_FLAGS, NativeBuildError, build_library

REAL_CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(REAL_CC is None, reason="no C compiler")
QUOTED = r"\342\200\230x\342\200\231"  # gcc's UTF-8 quotation marks
TINY = "int answer(void) { return 42; }\n"


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + 'if [ "$1" = "--version" ]; then echo "fake-cc 1.0"; exit 0; fi\n' + body,
                    encoding="utf-8")
    path.chmod(0o755)
    return str(path)


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path, use_settings):
    use_settings(kernel_cache=tmp_path / "cache")
    return tmp_path / "cache"


@needs_cc
def test_the_attention_kernels_compile_without_a_warning_on_this_cpu(tmp_path):
    src = tmp_path / "k.c"
    src.write_text(_SOURCE, encoding="utf-8")
    done = subprocess.run([REAL_CC, *BASE_FLAGS, str(src), "-o", str(tmp_path / "k.so")], capture_output=True)
    assert done.returncode == 0
    assert done.stderr.decode(errors="replace") == ""


@needs_cc
def test_a_library_is_built_once_then_found_in_the_cache(tmp_path, kernel_cache):
    log = tmp_path / "calls"
    cc = script(tmp_path / "counting-cc", f'echo x >> {log}\nexec {REAL_CC} "$@"\n')
    first = build_library("tiny", TINY, compiler=cc)
    assert first.parent == kernel_cache and first.exists()
    assert build_library("tiny", TINY, compiler=cc) == first
    assert log.read_text().count("x") == 1


@needs_cc
def test_the_cache_key_tells_cpus_apart(monkeypatch):
    avx2 = build_library("tiny", TINY, compiler=REAL_CC)
    monkeypatch.setattr(native_build, "cpu_id", lambda: "model name: other\nflags: avx512f")
    assert build_library("tiny", TINY, compiler=REAL_CC) != avx2


def test_a_failing_compiler_is_one_error_quoting_its_non_ascii_output(tmp_path, kernel_cache):
    cc = script(tmp_path / "failing-cc", f"printf 'error: {QUOTED} broken\\n' >&2\nexit 3\n")
    with pytest.raises(NativeBuildError, match="exited with 3: error: \u2018x\u2019 broken"):
        build_library("tiny", TINY, compiler=cc)
    assert not list(kernel_cache.glob("*.so"))


def test_a_missing_compiler_is_one_error(tmp_path):
    with pytest.raises(NativeBuildError, match="not usable"):
        build_library("tiny", TINY, compiler=str(tmp_path / "no-such-cc"))


def test_an_unwritable_cache_is_one_error(tmp_path, use_settings):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory", encoding="utf-8")
    use_settings(kernel_cache=blocker / "cache")
    with pytest.raises(NativeBuildError, match="could not build tiny"):
        build_library("tiny", TINY, compiler=REAL_CC or "cc")


@pytest.mark.parametrize("fails", [False, True])
def test_kernels_under_an_ascii_interpreter_build_or_fall_back_once(tmp_path, kernel_cache, fails):
    """As inside Triton's stub: Python's default encoding ASCII, the compiler printing UTF-8. The kernels load
    (noisy compiler) or the torch path is chosen once and for all (failing compiler): never an exception."""
    if not fails and REAL_CC is None:
        pytest.skip("no C compiler")
    log = tmp_path / "calls"
    tail = "exit 1\n" if fails else f'exec {REAL_CC} "$@"\n'
    cc = script(tmp_path / "cc", f"echo x >> {log}\nprintf 'note: {QUOTED}\\n' >&2\n{tail}")
    code = ("import locale; assert locale.getpreferredencoding(False).lower() in ('ascii', 'ansi_x3.4-1968')\n"
            "from tgi_llm.attention.cpu_kernels import cpu_attention_kernels\n"
            "first, second = cpu_attention_kernels(), cpu_attention_kernels()\n"
            "assert first is second\n"
            "print('kernels' if first is not None else 'torch')\n")
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0", "CC": cc,
           "TGI_LLM_KERNEL_CACHE": str(kernel_cache), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout.decode().strip() == ("torch" if fails else "kernels")
    assert log.read_text().count("x") == 1  # one build attempt, however many callers
    if fails:
        assert "CPU attention: torch path" in done.stderr.decode(errors="replace")


@needs_cc
def test_processes_building_the_same_library_at_once_compile_it_once(tmp_path, kernel_cache):
    """As the launcher's kernels step and the model's load on a first start, or tensor-parallel ranks: the
    second waits for the first's build and loads it."""
    log = tmp_path / "calls"
    cc = script(tmp_path / "slow-cc", f'echo x >> {log}\nsleep 2\nexec {REAL_CC} "$@"\n')
    code = ("import sys; from tgi_llm.native_build import build_library;"
            f"print(build_library('tiny', {TINY!r}, compiler={cc!r}))")
    env = {"PATH": "/usr/bin:/bin", "TGI_LLM_KERNEL_CACHE": str(kernel_cache),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    builders = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [b.communicate(timeout=300) for b in builders]
    assert [b.returncode for b in builders] == [0, 0], outputs
    paths = {out.strip() for out, _ in outputs}
    assert len(paths) == 1 and Path(paths.pop()).exists()
    assert log.read_text().count("x") == 1


@needs_cc
def test_a_build_that_never_ends_elsewhere_is_one_error_not_a_hang(tmp_path, kernel_cache, monkeypatch):
    import fcntl

    monkeypatch.setattr(native_build, "LOCK_WAIT_S", 0.5)
    first = build_library("tiny", TINY, compiler=REAL_CC)
    first.unlink()
    with open(first.with_suffix(".lock"), "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a process stuck in its build would hold it
        with pytest.raises(NativeBuildError, match="another process has been building tiny"):
            build_library("tiny", TINY, compiler=REAL_CC)
    assert build_library("tiny", TINY, compiler=REAL_CC) == first  # once it lets go, the build goes on
