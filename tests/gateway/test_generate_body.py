"""Generate bodies are type-checked against the model's inputs, with messages naming the field."""

from __future__ import annotations

import pytest

from tgi_llm.gateway.generate_body import BadBody, check_generate_body


@pytest.mark.parametrize(
    "body",
    [
        {"text_input": "hi"},
        {"text_input": ["hi"], "max_tokens": 3, "temperature": 0.5, "top_p": 1, "stream": True},
        {"text_input": "hi", "stop": "x"},
        {"text_input": "hi", "stop": ["a", "b"], "seed": 2**64 - 1},
        {"text_input": "hi", "max_new_tokens": 3, "details": True, "watermark": False, "adapter_id": "x"},
        {"input_ids": [0, 1, 2**63 - 1], "max_tokens": 3},
    ],
)
def test_bodies_triton_can_convert_pass(body):
    check_generate_body(body)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "must be a JSON object"),
        ({"text_input": "hi", "max_tokens": "abc"}, "`max_tokens` must be an integer. Given: 'abc'"),
        ({"text_input": "hi", "max_tokens": 3.5}, "`max_tokens` must be an integer"),
        ({"text_input": "hi", "max_tokens": True}, "`max_tokens` must be an integer"),
        ({"text_input": "hi", "max_tokens": 2**31}, "`max_tokens` must be >= -2147483648 and <= 2147483647"),
        ({"text_input": "hi", "seed": -1}, "`seed` must be >= 0"),
        ({"text_input": "hi", "temperature": "x"}, "`temperature` must be a number"),
        ({"text_input": "hi", "stream": "yes"}, "`stream` must be a boolean"),
        ({"text_input": 5}, "`text_input` must be a string"),
        ({"text_input": ["a", "b"]}, "`text_input` must hold exactly one value. Given: 2"),
        ({"text_input": "hi", "stop": [1]}, "`stop` must be a string"),
        ({"text_input": "hi", "foo": {"a": 1}}, "`foo` is not an input of this model"),
        ({"text_input": "hi", "best_of": 1.5}, "`best_of` is not an input of this model"),
        ({"text_input": "hi", "n": 2**63}, "`n` must be >= "),
        # Triton answered these 500 ("attempt to access JSON non-signed-integer as signed-integer").
        ({"input_ids": [1, 2**64]}, "`input_ids` must be >= -9223372036854775808 and <= 9223372036854775807"),
        ({"input_ids": [1, -1]}, "`input_ids` must hold token ids >= 0. Given: -1"),
        ({"input_ids": [1, "2"]}, "`input_ids` must be an integer"),
    ],
)
def test_wrong_types_name_the_field(body, message):
    with pytest.raises(BadBody) as info:
        check_generate_body(body)
    assert message in str(info.value)
