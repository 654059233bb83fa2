"""The checked-in model repository is what the launcher writes, and it matches the adapter's names."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

from tgi_llm.engine import EngineOptions, LimitOptions
from tgi_llm.launcher.repository import (
    DEFAULT_PARAMETERS,
    INPUTS,
    MODEL_PY,
    OUTPUTS,
    render_config,
    write_repository,
)
from tgi_llm.speculation.policy import SERVED_SPECULATE
from tgi_llm.triton import outputs, trtllm_forwarder
from tgi_llm.triton.inputs import ACCEPTED_INPUTS, SCALAR_INPUTS

ROOT = Path(__file__).resolve().parents[2]
REPO = ROOT / "model_repository" / "tgi_llm"


def test_checked_in_repository_is_the_rendered_default():
    assert (REPO / "config.pbtxt").read_text() == render_config(), \
        "regenerate: python -c 'from pathlib import Path; from tgi_llm.launcher.repository import " \
        "write_repository; write_repository(Path(\"model_repository\"))'"
    assert (REPO / "1" / "model.py").read_text() == MODEL_PY


def test_config_is_decoupled_python_without_triton_batching():
    text = render_config()
    assert 'backend: "python"' in text
    assert "decoupled: true" in text
    assert "max_batch_size: 0" in text
    assert "count: 1" in text


def test_every_parameter_is_an_engine_option_or_an_adapter_setting():
    engine_fields = {f.name for f in fields(EngineOptions)} | {f.name for f in fields(LimitOptions)}
    adapter = {"json_output", "cancellation_poll_ms", "validation_workers"}
    assert set(DEFAULT_PARAMETERS) <= engine_fields | adapter
    assert engine_fields - {"limits"} <= set(DEFAULT_PARAMETERS)
    opts = EngineOptions.from_parameters(DEFAULT_PARAMETERS)
    assert opts.limits == replace(LimitOptions(), speculate=SERVED_SPECULATE)  # the server speculates


def test_declared_tensors_are_the_ones_the_adapter_reads_and_writes():
    declared_in = {name for name, _, _ in INPUTS}
    read = set(SCALAR_INPUTS) | {"text_input", "input_ids", "stream", "stop", "exclude_input_in_output",
                                 "sampling_parameters", *ACCEPTED_INPUTS,
                                 "guided_decoding_guide_type", "guided_decoding_guide"}
    assert declared_in == read
    written = {v for k, v in vars(outputs).items() if k.isupper() and isinstance(v, str)}
    assert {name for name, _, _ in OUTPUTS} == written


def test_checked_in_trtllm_forwarder_is_the_rendered_one_and_maps_every_input():
    repo = ROOT / "model_repository" / "tgi_llm_trtllm"
    assert (repo / "config.pbtxt").read_text(encoding="utf-8") == trtllm_forwarder.render_config()
    assert "trtllm_forwarder import TritonPythonModel" in (repo / "1" / "model.py").read_text(encoding="utf-8")
    declared_here = {name for name, _, _ in INPUTS}
    assert {target for _, target, _ in trtllm_forwarder.SCALARS} | {"stop"} <= declared_here


def test_the_launcher_writes_both_models_as_checked_in(tmp_path):
    write_repository(tmp_path, {"dtype": "bfloat16"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tgi_llm", "tgi_llm_trtllm"]
    assert 'string_value: "bfloat16"' in (tmp_path / "tgi_llm" / "config.pbtxt").read_text(encoding="utf-8")
    for name in ("config.pbtxt", "1/model.py"):
        written, checked_in = (root / "tgi_llm_trtllm" / name for root in (tmp_path, ROOT / "model_repository"))
        assert written.read_text(encoding="utf-8") == checked_in.read_text(encoding="utf-8")
