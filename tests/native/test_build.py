"""Building the C kernels: warning-free, located diagnostics, cached per CPU, every failure one clear error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.native.builds import patched_sources
from tgi_llm.native import build
from tgi_llm.native.build import BASE_FLAGS, SOURCE_ROOT, UNITS, NativeBuildError, Unit, build_library

REAL_CC = shutil.which("cc") or shutil.which("gcc")
QUOTED = r"\342\200\230x\342\200\231"  # gcc's UTF-8 quotation marks
TINY_UNITS = (Unit("tiny.c"),)
ROOT = Path(__file__).resolve().parents[2]


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + 'if [ "$1" = "--version" ]; then echo "fake-cc 1.0"; exit 0; fi\n' + body,
                    encoding="utf-8")
    path.chmod(0o755)
    return str(path)


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path, use_settings):
    use_settings(kernel_cache=tmp_path / "cache")
    return tmp_path / "cache"


@pytest.fixture
def tiny(tmp_path) -> Path:
    """A source root of one unit."""
    root = tmp_path / "tiny-src"
    (root / "include").mkdir(parents=True)
    (root / "tiny.c").write_text("int answer(void) { return 42; }\n", encoding="utf-8")
    return root


def test_a_c_compiler_is_there():
    """The kernels' tests fail, not skip, on a machine without one (tests/conftest.py c_kernels): say so first."""
    assert REAL_CC is not None, "no C compiler (cc or gcc) on PATH: the C kernels cannot be built or tested"


def test_every_unit_compiles_without_a_warning_on_this_cpu(tmp_path):
    for unit in UNITS:
        done = subprocess.run([REAL_CC, *BASE_FLAGS, *unit.flags, "-I", str(SOURCE_ROOT / "include"), "-c",
                               str(SOURCE_ROOT / unit.source), "-o", str(tmp_path / unit.object_name)],
                              capture_output=True)
        assert done.returncode == 0 and done.stderr.decode(errors="replace") == "", unit.source


def test_a_compile_error_names_the_real_file_and_line(tmp_path):
    root = patched_sources(tmp_path, "layer_stack/layer_stack.c", "#define PAR_MIN_ROWS 128",
                           "#define PAR_MIN_ROWS 128\nnot C;")
    line = (root / "layer_stack/layer_stack.c").read_text().splitlines().index("not C;") + 1
    with pytest.raises(NativeBuildError, match=rf"layer_stack/layer_stack\.c:{line}:"):
        build_library("broken", root=root)


def test_the_build_writes_compile_commands_beside_the_library(tiny):
    lib = build_library("tiny", root=tiny, units=TINY_UNITS, compiler=REAL_CC)
    [entry] = json.loads((lib.parent / "compile_commands.json").read_text())
    assert entry["file"] == str(tiny / "tiny.c") and "-Wall" in entry["arguments"]
    assert Path(entry["output"]).exists()


def test_a_library_is_built_once_then_found_in_the_cache(tmp_path, kernel_cache, tiny):
    log = tmp_path / "calls"
    cc = script(tmp_path / "counting-cc", f'echo x >> {log}\nexec {REAL_CC} "$@"\n')
    first = build_library("tiny", root=tiny, units=TINY_UNITS, compiler=cc)
    assert first.parent.parent == kernel_cache and first.exists()
    assert build_library("tiny", root=tiny, units=TINY_UNITS, compiler=cc) == first
    assert log.read_text().count("x") == 2  # one compile, one link


def test_the_cache_key_tells_cpus_sources_and_unit_flags_apart(monkeypatch, tiny):
    first = build_library("tiny", root=tiny, units=TINY_UNITS, compiler=REAL_CC)
    assert build_library("tiny", root=tiny, units=(Unit("tiny.c", ("-DX",)),), compiler=REAL_CC) != first
    (tiny / "include" / "unused.h").write_text("/* a header counts too */\n", encoding="utf-8")
    with_header = build_library("tiny", root=tiny, units=TINY_UNITS, compiler=REAL_CC)
    assert with_header != first
    monkeypatch.setattr(build, "cpu_id", lambda: "model name: other\nflags: avx512f")
    assert build_library("tiny", root=tiny, units=TINY_UNITS, compiler=REAL_CC) != with_header


def test_a_failing_compiler_is_one_error_quoting_its_non_ascii_output(tmp_path, kernel_cache, tiny):
    cc = script(tmp_path / "failing-cc", f"printf 'error: {QUOTED} broken\\n' >&2\nexit 3\n")
    with pytest.raises(NativeBuildError, match="exited with 3: error: \u2018x\u2019 broken"):
        build_library("tiny", root=tiny, units=TINY_UNITS, compiler=cc)
    assert not list(kernel_cache.rglob("*.so"))


def test_a_missing_compiler_is_one_error(tmp_path, tiny):
    with pytest.raises(NativeBuildError, match="not usable"):
        build_library("tiny", root=tiny, units=TINY_UNITS, compiler=str(tmp_path / "no-such-cc"))


def test_an_unwritable_cache_is_one_error(tmp_path, use_settings, tiny):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory", encoding="utf-8")
    use_settings(kernel_cache=blocker / "cache")
    with pytest.raises(NativeBuildError, match="could not build tiny"):
        build_library("tiny", root=tiny, units=TINY_UNITS, compiler=REAL_CC or "cc")


@pytest.mark.parametrize("fails", [False, True])
def test_kernels_under_an_ascii_interpreter_build_or_fall_back_once(tmp_path, kernel_cache, fails):
    """As inside Triton's stub: Python's default encoding ASCII, the compiler printing UTF-8. The kernels load
    (noisy compiler) or the torch path is chosen once and for all (failing compiler): never an exception."""
    log = tmp_path / "calls"
    tail = "exit 1\n" if fails else f'exec {REAL_CC} "$@"\n'
    cc = script(tmp_path / "cc", f"echo x >> {log}\nprintf 'note: {QUOTED}\\n' >&2\n{tail}")
    code = ("import locale; assert locale.getpreferredencoding(False).lower() in ('ascii', 'ansi_x3.4-1968')\n"
            "from tgi_llm.attention.cpu_kernels import cpu_attention_kernels\n"
            "from tgi_llm.quant.kernels import quant_kernels\n"
            "first, second = cpu_attention_kernels(), cpu_attention_kernels()\n"
            "assert first is second and (quant_kernels() is None) == (first is None)\n"
            "print('kernels' if first is not None else 'torch')\n")
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0", "CC": cc,
           "TGI_LLM_KERNEL_CACHE": str(kernel_cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout.decode().strip() == ("torch" if fails else "kernels")
    # one build attempt however many callers: every unit compiled side by side (the first failure ends it)
    assert log.read_text().count("x") == (len(UNITS) if fails else len(UNITS) + 1)
    if fails:
        assert "CPU attention: torch path" in done.stderr.decode(errors="replace")


def test_processes_building_the_same_library_at_once_compile_it_once(tmp_path, kernel_cache, tiny):
    """As the launcher's kernels step and the model's load on a first start, or tensor-parallel ranks: the
    second waits for the first's build and loads it."""
    log = tmp_path / "calls"
    cc = script(tmp_path / "slow-cc", f'echo x >> {log}\nsleep 2\nexec {REAL_CC} "$@"\n')
    code = ("import sys; from pathlib import Path; from tgi_llm.native.build import Unit, build_library;"
            f"print(build_library('tiny', root=Path({str(tiny)!r}), units=(Unit('tiny.c'),), compiler={cc!r}))")
    env = {"PATH": "/usr/bin:/bin", "TGI_LLM_KERNEL_CACHE": str(kernel_cache), "PYTHONPATH": str(ROOT)}
    builders = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [b.communicate(timeout=300) for b in builders]
    assert [b.returncode for b in builders] == [0, 0], outputs
    paths = {out.strip() for out, _ in outputs}
    assert len(paths) == 1 and Path(paths.pop()).exists()
    assert log.read_text().count("x") == 2  # one compile, one link


def test_a_build_that_never_ends_elsewhere_is_one_error_not_a_hang(tmp_path, kernel_cache, monkeypatch, tiny):
    import fcntl

    monkeypatch.setattr(build, "LOCK_WAIT_S", 0.5)
    first = build_library("tiny", root=tiny, units=TINY_UNITS, compiler=REAL_CC)
    shutil.rmtree(first.parent)
    with open(first.parent.with_suffix(".lock"), "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a process stuck in its build would hold it
        with pytest.raises(NativeBuildError, match="another process has been building tiny"):
            build_library("tiny", root=tiny, units=TINY_UNITS, compiler=REAL_CC)
    assert build_library("tiny", root=tiny, units=TINY_UNITS, compiler=REAL_CC) == first  # once it lets go
