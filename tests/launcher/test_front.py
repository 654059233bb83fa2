"""The launcher's half of the front: which family and limits /info names, read without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys

from tgi_llm.launcher.args import parse_args, validate
from tgi_llm.launcher.front import _derived_limits, _model_family


def test_the_family_serving_the_model_is_read_from_its_config(tiny_model_factory, tmp_path):
    assert _model_family(tiny_model_factory("qwen3", head_dim=16)) == "qwen3"
    assert _model_family(tiny_model_factory("starcoder2")) == "transformers"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    assert _model_family(tmp_path) is None  # the model's own load says why
    assert _model_family(tmp_path / "missing") is None


def test_reading_it_imports_no_torch(tiny_model_factory):
    """The launcher is a supervisor that lives as long as the server: torch's ~230 MB stay out of it."""
    model_dir = tiny_model_factory("qwen3", head_dim=16)
    code = (f"import sys; from tgi_llm.launcher.front import _model_family; "
            f"print(_model_family({str(model_dir)!r}), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["qwen3", "False"]


def test_info_reports_the_context_the_rope_flags_allow(tiny_model_factory):
    model_dir = tiny_model_factory(max_position_embeddings=256)
    assert _derived_limits(validate(parse_args([], {})), model_dir)["max_total_tokens"] == 256
    scaled = _derived_limits(validate(parse_args(["--rope-factor", "4"], {})), model_dir)
    assert (scaled["max_input_tokens"], scaled["max_total_tokens"]) == (1023, 1024)  # the engine's own (builder.py)

