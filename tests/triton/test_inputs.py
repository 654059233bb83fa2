"""Triton tensors and request parameters -> prompt, TGI parameters and the stream flag."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tgi_llm.errors import ValidationError
from tgi_llm.triton.inputs import parse_request

from .fakes import tensors


def text(value: str) -> np.ndarray:
    return np.array([value.encode()], dtype=np.object_)


def test_prompt_and_defaults():
    parsed = parse_request(tensors(text_input=text("Hello")), "")
    assert parsed.inputs == "Hello"
    assert parsed.params == {}
    assert parsed.stream is False


def test_token_ids_are_the_prompt_and_exclude_text():
    parsed = parse_request(tensors(input_ids=np.array([5, 6, 7], dtype=np.int64)), "")
    assert parsed.inputs == [5, 6, 7]
    with pytest.raises(ValidationError, match="`text_input` and `input_ids` are two forms of the prompt"):
        parse_request(tensors(text_input=text("Hello"), input_ids=np.array([5], dtype=np.int64)), "")


def test_tensor_names_become_tgi_parameters_with_python_types():
    parsed = parse_request(tensors(
        text_input=text("Hi"),
        stream=np.array([True]),
        max_tokens=np.array([7], dtype=np.int32),
        temperature=np.array([0.7], dtype=np.float32),
        top_k=np.array([3], dtype=np.int32),
        seed=np.array([2**64 - 1], dtype=np.uint64),
        do_sample=np.array([True]),
        details=np.array([True]),
        stop=np.array([b"\n", b"END"], dtype=np.object_),
    ), None)
    assert parsed.stream is True
    assert parsed.params == {
        "max_new_tokens": 7, "temperature": 0.7, "top_k": 3, "seed": 2**64 - 1, "do_sample": True,
        "details": True, "stop": ["\n", "END"],
    }
    assert type(parsed.params["max_new_tokens"]) is int and type(parsed.params["do_sample"]) is bool


def test_float32_values_keep_the_decimal_that_was_sent():
    # 1.0 must stay 1.0 (not 1.0000000x) and 0.9 stay 0.9, or TGI's range checks misfire.
    parsed = parse_request(tensors(text_input=text("x"), top_p=np.array([0.9], dtype=np.float32)), None)
    assert parsed.params["top_p"] == 0.9


def test_request_parameters_carry_tgi_names_and_tensors_win():
    params = json.dumps({"max_new_tokens": 5, "repetition_penalty": 1.2, "max_tokens": 9, "priority": 1,
                         "triton_enable_empty_final_response": True, "tgi_llm_error_code": True})
    parsed = parse_request(tensors(text_input=text("x"), max_tokens=np.array([3], dtype=np.int32)), params)
    assert parsed.params == {"max_new_tokens": 3, "repetition_penalty": 1.2}


def test_stream_as_a_parameter():
    assert parse_request(tensors(text_input=text("x")), json.dumps({"stream": True})).stream is True


def test_exclude_input_in_output_is_the_inverse_of_return_full_text():
    parsed = parse_request(tensors(text_input=text("x"), exclude_input_in_output=np.array([False])), None)
    assert parsed.params["return_full_text"] is True
    parsed = parse_request(tensors(text_input=text("x")), json.dumps({"exclude_input_in_output": True}))
    assert parsed.params["return_full_text"] is False


def test_vllm_sampling_parameters_json():
    sampling = json.dumps({"max_tokens": 4, "temperature": 0, "top_k": -1, "top_p": 0.5})
    parsed = parse_request(tensors(text_input=text("x"), sampling_parameters=text(sampling)), None)
    assert parsed.params == {"max_new_tokens": 4, "top_p": 0.5}


def test_vllm_sampling_parameters_written_as_strings_as_genai_perf_sends_them():
    sampling = json.dumps({"max_tokens": "32", "temperature": "0.5", "min_tokens": "32", "ignore_eos": "true",
                           "top_k": "-1", "stop": ["a"], "top_p": "oops"})
    parsed = parse_request(tensors(text_input=text("x"), sampling_parameters=text(sampling)), None)
    assert parsed.params == {"max_new_tokens": 32, "temperature": 0.5, "min_new_tokens": 32, "ignore_eos": True,
                             "stop": ["a"], "top_p": "oops"}  # what does not parse is left for validation to name


def test_minimum_lengths_under_vllm_and_tensorrt_llm_names():
    assert parse_request(tensors(text_input=text("x"), min_length=np.array([7], dtype=np.int32)), None) \
        .params["min_new_tokens"] == 7
    assert parse_request(tensors(text_input=text("x")), json.dumps({"min_tokens": 3})).params == {"min_new_tokens": 3}


def test_guided_decoding_tensors_become_tgis_grammar():
    parsed = parse_request(tensors(text_input=text("x"), guided_decoding_guide_type=text("regex"),
                                   guided_decoding_guide=text("[0-9]+")), None)
    assert parsed.params["grammar"] == {"type": "regex", "value": "[0-9]+"}
    any_json = parse_request(tensors(text_input=text("x"), guided_decoding_guide_type=text("json")), None)
    assert any_json.params["grammar"] == {"type": "json", "value": "{}"}
    none = parse_request(tensors(text_input=text("x"), guided_decoding_guide_type=text("None")), None)
    assert "grammar" not in none.params


@pytest.mark.parametrize(
    ("getter", "params", "field"),
    [
        (tensors(), None, "text_input"),
        (tensors(text_input=np.array([b"a", b"b"], dtype=np.object_)), None, "text_input"),
        (tensors(text_input=np.array([b"\xff"], dtype=np.object_)), None, "text_input"),
        (tensors(text_input=text("x"), top_k=np.array([1, 2], dtype=np.int32)), None, "top_k"),
        (tensors(text_input=text("x")), json.dumps({"stream": "yes"}), "stream"),
        (tensors(text_input=text("x")), "{not json", "parameters"),
        (tensors(text_input=text("x"), sampling_parameters=text("[1]")), None, "sampling_parameters"),
    ],
)
def test_malformed_requests_name_the_field(getter, params, field):
    with pytest.raises(ValidationError, match=field):
        parse_request(getter, params)


def test_stop_list_is_bounded_before_its_strings_are_decoded():
    many = np.array([b"\xff"] * 1000, dtype=np.object_)  # invalid UTF-8: decoding would fail differently
    with pytest.raises(ValidationError, match="`stop` supports up to 4 stop sequences. Given: 1000"):
        parse_request(tensors(text_input=text("Hi"), stop=many), None, max_stop_sequences=4)
    ok = parse_request(tensors(text_input=text("Hi"), stop=np.array([b"a"] * 4, dtype=np.object_)), None,
                       max_stop_sequences=4)
    assert ok.params["stop"] == ["a"] * 4


def test_tensorrt_llm_shaped_requests_are_forwarded_with_tgi_llms_shapes():
    from tgi_llm.triton.trtllm_forwarder import forwarded_inputs, with_batch_dimension

    sent = {"text_input": np.array([[b"Hi"]], dtype=np.object_), "max_tokens": np.array([[5]], dtype=np.int32),
            "stop_words": np.array([[b"\n", b"."]], dtype=np.object_), "seed": np.array([[7]], dtype=np.uint64)}
    forwarded = forwarded_inputs(sent.get)
    assert {k: v.shape for k, v in forwarded.items()} == {"text_input": (1,), "max_tokens": (1,), "stop": (2,),
                                                         "seed": (1,)}
    parsed = parse_request(forwarded.get, None)
    assert parsed.inputs == "Hi" and parsed.params == {"max_new_tokens": 5, "stop": ["\n", "."], "seed": 7}
    assert with_batch_dimension(np.array([b"x"], dtype=np.object_)).shape == (1, 1)
