"""Find tritonserver and build its command line and environment.

Two installs are supported: the system one (NGC's Triton container: /opt/tritonserver, Python
backend included), else the one inside the nvidia-pytriton wheel. The wheel keeps a Python-backend
stub per Python version apart from the backend, so we assemble a backend directory with the stub
that matches this interpreter, and point the embedded interpreter at this environment: this
Python's libpython on LD_LIBRARY_PATH, and this environment's bin/ first on PATH (the stub's
embedded Python finds its prefix, hence the venv's site-packages, from `python3` on PATH).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import tgi_llm
from tgi_llm.launcher.repository import MODEL_NAME, TRTLLM_MODEL_NAME

SYSTEM_BINARY = Path("/opt/tritonserver/bin/tritonserver")
_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    source: str  # "system", "pytriton" or "explicit"
    backend_dir: Path | None = None  # None: the server's own default (/opt/tritonserver/backends)
    library_path: list[str] = field(default_factory=list)  # prepended to LD_LIBRARY_PATH


def find_tritonserver(work_dir: Path, explicit: str | None = None) -> TritonInstall:
    """`explicit` (--tritonserver), else tritonserver on PATH or in /opt/tritonserver, else the
    nvidia-pytriton wheel's (its backend directory assembled under `work_dir`)."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise FileNotFoundError(f"tritonserver binary {explicit} does not exist")
        return TritonInstall(path, "explicit")
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(Path(on_path), "system")
    if SYSTEM_BINARY.is_file():
        return TritonInstall(SYSTEM_BINARY, "system")
    return pytriton_install(work_dir)


def pytriton_install(work_dir: Path) -> TritonInstall:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "no tritonserver found: not on PATH, not in /opt/tritonserver, and the nvidia-pytriton wheel "
            "is not installed (pip install 'nvidia-pytriton'; or use NGC's tritonserver container)"
        )
    root = Path(spec.origin).parent / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise FileNotFoundError(f"nvidia-pytriton has no Python-backend stub for Python {version} ({stub})")
    backend_dir = work_dir / "backends"
    python_dir = backend_dir / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for name in _BACKEND_FILES:
        _copy(root / "backends" / "python" / name, python_dir / name)
    _copy(stub, python_dir / "triton_python_backend_stub")
    libs = [sysconfig.get_config_var("LIBDIR") or "", str(root.parent.parent / "nvidia_pytriton.libs")]
    return TritonInstall(root / "bin" / "tritonserver", "pytriton", backend_dir, [p for p in libs if p])


def _copy(src: Path, dst: Path) -> None:
    if dst.exists() and dst.stat().st_size == src.stat().st_size:
        return
    shutil.copy2(src, dst)


def has_gpu() -> bool:
    return Path("/proc/driver/nvidia/version").exists()


@dataclass(frozen=True)
class ServerConfig:
    model_repository: Path
    hostname: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    log_verbose: int = 0
    exit_timeout_s: int = 90
    extra_args: tuple[str, ...] = ()


def server_command(install: TritonInstall, config: ServerConfig) -> list[str]:
    host = config.hostname
    cmd = [
        str(install.binary),
        f"--model-repository={config.model_repository}",
        f"--http-address={host}",
        f"--http-port={config.http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={config.grpc_port}",
        f"--metrics-address={host}",
        f"--metrics-port={config.metrics_port}",
        # A model that fails to load stops the server, so the launcher can report it.
        "--exit-on-error=true",
        "--strict-readiness=true",
        # Explicit control lets the model unload itself when its engine dies (a shard crashed), so
        # /v2/models/tgi_llm/ready turns false; the launcher then stops, as TGI's does on ShardFailed.
        "--model-control-mode=explicit",
        f"--load-model={MODEL_NAME}",
        f"--load-model={TRTLLM_MODEL_NAME}",
        f"--exit-timeout-secs={config.exit_timeout_s}",
        f"--log-verbose={config.log_verbose}",
    ]
    if install.backend_dir is not None:
        cmd.append(f"--backend-directory={install.backend_dir}")
    if not has_gpu():
        cmd.append("--allow-gpu-metrics=false")
    return cmd + list(config.extra_args)


def server_env(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(Path(sys.exec_prefix) / "bin"), env.get("PATH", "")]).rstrip(os.pathsep)
    if install.library_path:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*install.library_path, env.get("LD_LIBRARY_PATH", "")]).rstrip(
            os.pathsep
        )
    # The stub imports the same tgi_llm as this process, installed or not.
    package_root = str(Path(tgi_llm.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env
