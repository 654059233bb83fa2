"""LOG_LEVEL parsing, --json-output lines, and reading tritonserver's log."""

from __future__ import annotations

import json
import logging

from tgi_llm.launcher.logs import JsonFormatter, parse_level
from tgi_llm.launcher.process import load_failure, triton_line_as_json


def test_log_level_like_tgi_env_filter():
    assert parse_level(None) == logging.INFO
    assert parse_level("debug") == logging.DEBUG
    assert parse_level("text_generation_launcher=debug,warn") == logging.WARNING
    assert parse_level("tgi_llm=error") == logging.ERROR


def test_json_lines_shaped_like_tgi():
    record = logging.LogRecord("tgi_llm.launcher", logging.WARNING, __file__, 1, "hello %s", ("x",), None)
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "WARN" and line["fields"]["message"] == "hello x" and line["target"] == "tgi_llm.launcher"
    assert "timestamp" in line


def test_tritonserver_lines_become_json_with_their_level():
    line = json.loads(triton_line_as_json('E1122 17:08:52.19 18287 model_lifecycle.cc:642] "boom"\n'))
    assert line["level"] == "ERROR" and line["target"] == "tritonserver" and "boom" in line["fields"]["message"]
    already = '{"level": "INFO", "fields": {"message": "from the stub"}}'
    assert triton_line_as_json(already) == already


def test_load_failure_reason_is_read_from_the_log():
    line = ("E1122 model_lifecycle.cc:642] \"failed to load 'tgi_llm' version 1: Internal: ValueError: no "
            "tokenizer\\n\\nAt:\\n  builder.py(68)\"")
    assert load_failure(line) == "Internal: ValueError: no tokenizer"
    assert load_failure('I1122 "successfully loaded \'tgi_llm\'"') is None
