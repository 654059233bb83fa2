"""The runtime switches: parsed once from the environment, typed, refused with the variable's name when
malformed, overridable in tests, and documented in one table that matches the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tgi_llm.settings import Settings, SettingsError, override, settings, table

ROOT = Path(__file__).resolve().parents[1]


def test_unset_variables_take_the_defaults():
    s = Settings.from_env({})
    assert s == Settings()
    assert s.cpu_kernels and s.quant_kernels and s.fused_decode and s.amx and s.huge_pages
    assert s.cpu_prefill == "auto" and s.float_linears == "auto"
    assert s.kernel_cache == Path.home() / ".cache" / "tgi_llm" / "kernels"


def test_each_variable_is_parsed_into_its_type():
    s = Settings.from_env({"TGI_LLM_AMX": "0", "TGI_LLM_FUSED_DECODE": "off", "TGI_LLM_HUGE_PAGES": "False",
                           "TGI_LLM_CPU_PREFILL": "Kernel", "TGI_LLM_FLOAT_LINEARS": "onednn",
                           "TGI_LLM_KERNEL_CACHE": "/tmp/k", "TGI_LLM_CACHE": "~/models", "TGI_LLM_CPU_KERNELS": ""})
    assert (s.amx, s.fused_decode, s.huge_pages, s.cpu_kernels) == (False, False, False, True)
    assert (s.cpu_prefill, s.float_linears) == ("kernel", "onednn")
    assert s.kernel_cache == Path("/tmp/k") and s.cache == Path.home() / "models"


@pytest.mark.parametrize(("env", "message"), [
    ({"TGI_LLM_AMX": "maybe"}, "TGI_LLM_AMX must be one of 1, true"),
    ({"TGI_LLM_CPU_PREFILL": "sdpa"}, "TGI_LLM_CPU_PREFILL must be one of auto, kernel, torch. Given: 'sdpa'"),
    ({"TGI_LLM_FLOAT_LINEARS": "mkl"}, "TGI_LLM_FLOAT_LINEARS must be one of auto, c, onednn"),
])
def test_a_malformed_value_is_refused_naming_the_variable(env, message):
    with pytest.raises(SettingsError, match=re.escape(message)):
        Settings.from_env(env)


def test_override_applies_within_the_block_only(tmp_path):
    before = settings()
    with override(kernel_cache=tmp_path, amx=False) as inside:
        assert settings() is inside and settings().kernel_cache == tmp_path and not settings().amx
    assert settings() is before


def test_the_docs_table_lists_every_setting_as_the_code_defines_it():
    doc = (ROOT / "docs" / "SETTINGS.md").read_text(encoding="utf-8")
    rows = {m[0]: (m[1], m[2]) for m in re.findall(r"^\| `(TGI_LLM_\w+)` \| `([^`]*)` \| (.+?) \|$", doc, re.M)}
    expected = {name: (default, meaning) for name, default, meaning in table()}
    assert {k: v for k, v in rows.items() if k in expected} == expected
    assert set(expected) <= set(rows)
