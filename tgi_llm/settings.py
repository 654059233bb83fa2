"""The runtime switches: `TGI_LLM_*` environment variables, each parsed once per process into one typed,
frozen `Settings` (docs/SETTINGS.md lists them). Code reads `settings()`; tests inject values with
`override(...)` instead of patching the environment. A child process (tritonserver's model, a shard rank)
parses its own environment, so a launcher hands settings down by setting the variables.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SettingsError(ValueError):
    """A variable holds a value it does not take; the message names both."""


def _flag(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise SettingsError(f"{name} must be one of {', '.join(_TRUE + _FALSE)}. Given: {raw!r}")


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise SettingsError(f"{name} must be one of {', '.join(choices)}. Given: {raw!r}")
        return value

    return parse


def _path(_name: str, raw: str) -> Path:
    return Path(raw).expanduser()


def _setting(env: str, parse: Callable[[str, str], Any], default: Any, doc: str) -> Any:
    return field(default=default, metadata={"env": env, "parse": parse, "doc": doc})


_HOME_CACHE = Path.home() / ".cache" / "tgi_llm"


@dataclass(frozen=True)
class Settings:
    cache: Path = _setting("TGI_LLM_CACHE", _path, _HOME_CACHE,
                           "Root of the converted-GGUF cache (`gguf/` below it).")
    kernel_cache: Path = _setting("TGI_LLM_KERNEL_CACHE", _path, _HOME_CACHE / "kernels",
                                  "Where the C kernels built for this CPU are cached.")
    cpu_kernels: bool = _setting("TGI_LLM_CPU_KERNELS", _flag, True,
                                 "The C attention kernels (off: torch's SDPA and paged gather).")
    cpu_prefill: str = _setting("TGI_LLM_CPU_PREFILL", _choice("auto", "kernel", "torch"), "auto",
                                "Prompt attention: `auto` times the C kernel against SDPA at load and keeps the "
                                "faster; `kernel` or `torch` forces one.")
    quant_kernels: bool = _setting("TGI_LLM_QUANT_KERNELS", _flag, True,
                                   "The C linear kernels (off: quantized weights dequantized in torch).")
    float_linears: str = _setting("TGI_LLM_FLOAT_LINEARS", _choice("auto", "c", "onednn"), "auto",
                                  "float32 linears: the C kernels (`auto`, `c`) or oneDNN's packed GEMM (`onednn`).")
    fused_decode: bool = _setting("TGI_LLM_FUSED_DECODE", _flag, True,
                                  "The fused C layer stack for CPU steps (off: one torch call per layer).")
    amx: bool = _setting("TGI_LLM_AMX", _flag, True,
                         "AMX tiles where the CPU has them (off: AVX-512 only).")
    huge_pages: bool = _setting("TGI_LLM_HUGE_PAGES", _flag, True,
                                "Weights and the KV cache on transparent huge pages where the kernel allows.")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Each variable that is set (and not empty) parsed; SettingsError names a bad one."""
        env = os.environ if env is None else env
        values = {}
        for f in fields(cls):
            raw = env.get(f.metadata["env"])
            if raw:
                values[f.name] = f.metadata["parse"](f.metadata["env"], raw)
        return cls(**values)


def table() -> list[tuple[str, str, str]]:
    """(variable, default, meaning) for each setting: the docs' table is checked against it."""
    out = []
    for f in fields(Settings):
        default = f.default
        if isinstance(default, Path):
            default = "~/" + str(default.relative_to(Path.home())) if default.is_relative_to(Path.home()) else default
        elif isinstance(default, bool):
            default = "1" if default else "0"
        out.append((f.metadata["env"], str(default), f.metadata["doc"]))
    return out


_lock = threading.Lock()
_current: Settings | None = None


def settings() -> Settings:
    """This process's settings, parsed from its environment on first use."""
    global _current
    if _current is None:
        with _lock:
            if _current is None:
                _current = Settings.from_env()
    return _current


@contextlib.contextmanager
def override(**changes: Any) -> Iterator[Settings]:
    """Within the block, `settings()` answers with `changes` applied (for tests)."""
    global _current
    before = settings()
    _current = replace(before, **changes)
    try:
        yield _current
    finally:
        _current = before
