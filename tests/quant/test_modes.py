"""`--quantize` values: TGI's names where they fit, a clear error for everything else."""

from __future__ import annotations

import pytest

from tgi_llm.quant.modes import ACCEPTED, TGI_UNSUPPORTED, Quantization, parse_quantize


def test_accepted_values_and_aliases():
    assert parse_quantize(None) is None and parse_quantize("") is None
    assert parse_quantize("int4") == Quantization("int4", 32)
    assert parse_quantize("int4", 128) == Quantization("int4", 128)
    assert parse_quantize("INT8") == Quantization("int8", 32)
    assert parse_quantize("eetq") == parse_quantize("bitsandbytes") == Quantization("int8", 32)
    assert parse_quantize("gguf") == Quantization("gguf") and parse_quantize("float") == Quantization("float")


@pytest.mark.parametrize("value", [*TGI_UNSUPPORTED, "int3", "q4_1"])
def test_other_values_name_the_flag_and_what_is_accepted(value):
    with pytest.raises(ValueError, match="--quantize") as err:
        parse_quantize(value)
    assert ", ".join(ACCEPTED) in str(err.value)


@pytest.mark.parametrize(("value", "group", "match"), [
    ("int4", 48, "multiple of 32"), ("int8", 24, "multiple of 16"), ("gguf", 32, "int8 and int4 only"),
    (None, 32, "needs `--quantize int8`"),
])
def test_group_size_must_fit_the_mode(value, group, match):
    with pytest.raises(ValueError, match=match):
        parse_quantize(value, group)
