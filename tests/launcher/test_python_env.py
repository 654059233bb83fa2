"""The Python backend's scratch directory a killed tritonserver leaves behind is noted and removed."""

from __future__ import annotations

from tgi_llm.launcher.python_env import env_dirs, new_env_dir, remove_env_dirs


def test_the_one_directory_that_appeared_is_noted(tmp_path):
    (tmp_path / "python_env_old").mkdir()
    before = env_dirs(tmp_path)
    assert new_env_dir(before, tmp_path) is None  # nothing new yet
    (tmp_path / "python_env_new").mkdir()
    (tmp_path / "other_dir").mkdir()
    assert new_env_dir(before, tmp_path) == tmp_path / "python_env_new"


def test_two_that_appeared_at_once_are_not_ours_to_tell_apart(tmp_path):
    before = env_dirs(tmp_path)
    (tmp_path / "python_env_a").mkdir()
    (tmp_path / "python_env_b").mkdir()
    assert new_env_dir(before, tmp_path) is None


def test_only_noted_empty_directories_are_removed(tmp_path):
    noted, full, other = tmp_path / "python_env_a", tmp_path / "python_env_b", tmp_path / "python_env_c"
    for path in (noted, full, other):
        path.mkdir()
    (full / "env").write_text("x")
    assert remove_env_dirs([noted, full, tmp_path / "python_env_gone"]) == [noted]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python_env_b", "python_env_c"]
