"""Locating tritonserver and assembling what the nvidia-pytriton wheel needs to serve this Python."""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

import pytest

from tgi_llm.launcher import tritonserver as ts
from tgi_llm.launcher.tritonserver import ServerConfig, TritonInstall, server_command, server_env

needs_pytriton = pytest.mark.skipif(importlib.util.find_spec("pytriton") is None, reason="nvidia-pytriton missing")


@needs_pytriton
def test_pytriton_backend_dir_has_the_stub_for_this_python(tmp_path):
    install = ts.pytriton_install(tmp_path)
    assert install.binary.is_file() and os.access(install.binary, os.X_OK)
    python_dir = install.backend_dir / "python"
    for name in ("libtriton_python.so", "triton_python_backend_utils.py", "triton_python_backend_stub"):
        assert (python_dir / name).is_file()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    expected = install.binary.parent.parent / "python_backend_stubs" / version / "triton_python_backend_stub"
    assert (python_dir / "triton_python_backend_stub").read_bytes() == expected.read_bytes()
    assert os.access(python_dir / "triton_python_backend_stub", os.X_OK)
    assert sysconfig.get_config_var("LIBDIR") in install.library_path  # this Python's libpython, not the system's


def test_explicit_binary_wins_and_must_exist(tmp_path):
    binary = tmp_path / "tritonserver"
    binary.write_text("")
    assert ts.find_tritonserver(tmp_path, str(binary)) == TritonInstall(binary, "explicit")
    with pytest.raises(FileNotFoundError):
        ts.find_tritonserver(tmp_path, str(tmp_path / "missing"))


def test_command_line(tmp_path):
    install = TritonInstall(Path("/x/tritonserver"), "pytriton", tmp_path / "backends", ["/lib/py"])
    cmd = server_command(install, ServerConfig(tmp_path / "repo", "127.0.0.1", 1, 2, 3, exit_timeout_s=5))
    assert cmd[0] == "/x/tritonserver"
    for flag in (f"--model-repository={tmp_path / 'repo'}", "--http-port=1", "--grpc-port=2", "--metrics-port=3",
                 "--http-address=127.0.0.1", "--exit-on-error=true", "--exit-timeout-secs=5",
                 f"--backend-directory={tmp_path / 'backends'}"):
        assert flag in cmd


def test_environment_points_the_stub_at_this_python(tmp_path):
    install = TritonInstall(Path("/x/tritonserver"), "pytriton", tmp_path, ["/lib/py"])
    env = server_env(install, {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/old"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.exec_prefix) / "bin")
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == ["/lib/py", "/old"]
    import tgi_llm

    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(tgi_llm.__file__).resolve().parent.parent)
