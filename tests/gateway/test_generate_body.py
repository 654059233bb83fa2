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
    ],
)
def test_wrong_types_name_the_field(body, message):
    with pytest.raises(BadBody) as info:
        check_generate_body(body)
    assert message in str(info.value)
