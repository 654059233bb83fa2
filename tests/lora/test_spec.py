"""--lora-adapters as TGI writes it, and the launcher's checks of the LoRA flags (before anything loads)."""

from __future__ import annotations

import pytest

from tgi_llm.errors import ArgumentValidationError
from tgi_llm.launcher.args import model_parameters, parse_args, validate
from tgi_llm.lora.spec import parse_lora_adapters


def test_ids_and_paths():
    assert parse_lora_adapters("a=/x, b=/y ,") == {"a": "/x", "b": "/y"}
    assert parse_lora_adapters("org/adapter") == {"org/adapter": "org/adapter"}  # a bare path is its own id
    assert parse_lora_adapters(None) == {}
    with pytest.raises(ValueError, match="twice"):
        parse_lora_adapters("a=/x,a=/y")
    with pytest.raises(ValueError, match="no path"):
        parse_lora_adapters("a=")
    with pytest.raises(ValueError, match="must be 1-128 characters"):
        parse_lora_adapters("bad name=/x")


def test_the_launcher_names_the_bad_flag(tmp_path):
    with pytest.raises(ArgumentValidationError, match="`lora_adapters` a: .* is not a directory"):
        validate(parse_args(["--lora-adapters", f"a={tmp_path / 'missing'}"], env={}))
    with pytest.raises(ArgumentValidationError, match="`max_lora_rank` must be in 1..512. Given: 0"):
        validate(parse_args(["--max-lora-rank", "0"], env={}))


def test_the_model_gets_absolute_paths_and_the_environment_works(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ad").mkdir()
    args = validate(parse_args([], env={"LORA_ADAPTERS": "one=ad", "MAX_LORAS": "3"}))
    params = model_parameters(args, None)
    assert params["lora_adapters"] == f"one={tmp_path / 'ad'}" and params["max_loras"] == "3"
    assert params["lora_runtime_loading"] == "false"
