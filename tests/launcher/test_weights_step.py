"""Weights are prepared in a child process: the launcher gets the directory or the child's error, and the
launcher's own process never imports torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tgi_llm.launcher.weights_step import WeightsError, prepare_in_child


def test_the_child_answers_with_the_model_directory(default_model_dir):
    assert prepare_in_child(str(default_model_dir), "info", json_output=False) == default_model_dir


def test_the_childs_error_reaches_the_launcher(tmp_path):
    with pytest.raises(WeightsError, match="does not exist"):
        prepare_in_child(str(tmp_path / "nowhere" / "x" / "y"), "info", json_output=True)


def test_the_launcher_process_stays_without_torch(default_model_dir):
    code = ("import sys; from tgi_llm.launcher.main import prepare_weights;"
            f"print(prepare_weights({str(default_model_dir)!r}, None, 'info', False), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [str(default_model_dir), "False"]
