"""Triton request -> (prompt, TGI parameters, stream): the tensor names of Triton's vLLM/TRT-LLM models,
plus TGI's parameter names sent as Triton request parameters (what the HTTP generate extension makes
of JSON keys that are not inputs). Pure numpy/json, so it is tested without Triton.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tgi_llm.errors import ValidationError
from tgi_llm.triton.status import ERROR_CODE_PARAMETER

#: Scalar input tensors and the TGI parameter each one sets (config.pbtxt declares the same names).
SCALAR_INPUTS: dict[str, str] = {
    "max_tokens": "max_new_tokens",
    "max_new_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "typical_p": "typical_p",
    "repetition_penalty": "repetition_penalty",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "seed": "seed",
    "do_sample": "do_sample",
    "details": "details",
    "top_n_tokens": "top_n_tokens",
    "truncate": "truncate",
    "decoder_input_details": "decoder_input_details",
    "return_full_text": "return_full_text",
    "ignore_eos": "ignore_eos",
    "min_tokens": "min_new_tokens",  # vLLM's name
    "min_length": "min_new_tokens",  # TensorRT-LLM's
    "lora_name": "adapter_id",  # Triton's vLLM backend's
}

#: Triton's LLM names that mean a TGI parameter under another name (as request parameters too).
PARAMETER_ALIASES: dict[str, str] = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens",
                                     "min_length": "min_new_tokens", "lora_name": "adapter_id"}

#: Inputs tools send that change nothing here (num_input_tokens / num_output_tokens always come back).
ACCEPTED_INPUTS = ("return_num_input_tokens", "return_num_output_tokens")

#: Request parameters Triton itself may attach, and ours for the transport; never TGI parameters.
_TRITON_PARAMETERS = {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", ERROR_CODE_PARAMETER}


@dataclass(frozen=True)
class ParsedRequest:
    inputs: str | list[int]
    params: dict[str, Any] = field(default_factory=dict)
    stream: bool = False


TensorGetter = Callable[[str], "np.ndarray | None"]


def parse_request(tensor: TensorGetter, parameters: str | Mapping[str, Any] | None,
                  max_stop_sequences: int | None = None) -> ParsedRequest:
    """Read one request. `tensor(name)` returns the input as a numpy array, or None when absent.
    `max_stop_sequences` bounds the `stop` tensor before any of its strings is decoded."""
    params = _parameters(parameters)
    sampling = tensor("sampling_parameters")
    if sampling is not None:
        params |= _vllm_sampling_parameters(_prompt_like("sampling_parameters", sampling))
    for name, target in SCALAR_INPUTS.items():
        value = tensor(name)
        if value is not None:
            params[target] = _scalar(name, value)
    stop = tensor("stop")
    if stop is not None:
        stop = np.asarray(stop).reshape(-1)
        if max_stop_sequences is not None and stop.size > max_stop_sequences:
            raise ValidationError(f"`stop` supports up to {max_stop_sequences} stop sequences. Given: {stop.size}")
        params["stop"] = [_text("stop", v) for v in stop]
    grammar = _guided_decoding(tensor)
    if grammar is not None:
        params["grammar"] = grammar
    stream = params.pop("stream", False)
    value = tensor("stream")
    if value is not None:
        stream = _scalar("stream", value)
    if not isinstance(stream, bool):
        raise ValidationError(f"`stream` must be a boolean. Given: {stream!r}")
    exclude = params.pop("exclude_input_in_output", None)
    value = tensor("exclude_input_in_output")
    if value is not None:
        exclude = _scalar("exclude_input_in_output", value)
    if exclude is not None:
        if not isinstance(exclude, bool):
            raise ValidationError(f"`exclude_input_in_output` must be a boolean. Given: {exclude!r}")
        params["return_full_text"] = not exclude
    ids, text = tensor("input_ids"), tensor("text_input")
    if ids is not None and text is not None:
        raise ValidationError("`text_input` and `input_ids` are two forms of the prompt: send one")
    inputs = [int(i) for i in np.asarray(ids).reshape(-1)] if ids is not None else _prompt(text)
    return ParsedRequest(inputs=inputs, params=params, stream=stream)


def _guided_decoding(tensor: TensorGetter) -> dict[str, Any] | None:
    """TensorRT-LLM's guided decoding inputs as TGI's `grammar`: type json means any JSON value."""
    kind = tensor("guided_decoding_guide_type")
    if kind is None:
        return None
    kind = _prompt_like("guided_decoding_guide_type", kind).strip().lower()
    guide = tensor("guided_decoding_guide")
    value = _prompt_like("guided_decoding_guide", guide) if guide is not None else None
    if kind in ("", "none"):
        return None
    if kind == "json" and not value:
        value = "{}"
    return {"type": kind, "value": value}


def _parameters(raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"request parameters are not valid JSON: {exc}") from None
    out: dict[str, Any] = {}
    for key, value in dict(raw).items():
        if key in _TRITON_PARAMETERS or key.startswith("triton_"):
            continue
        out[PARAMETER_ALIASES.get(key, key)] = value
    return out


def _vllm_sampling_parameters(raw: str) -> dict[str, Any]:
    """Triton's vLLM model takes its sampling parameters as one JSON string; tools built for it send
    that. vLLM's "disabled" values (top_k -1, temperature 0 = greedy) become TGI's "not set"."""
    try:
        values = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"`sampling_parameters` must be a JSON object: {exc}") from None
    if not isinstance(values, dict):
        raise ValidationError("`sampling_parameters` must be a JSON object")
    out = {key: _from_string(key, value) for key, value in _parameters(values).items()}
    if out.get("top_k") in (-1, 0):
        out.pop("top_k")
    if out.get("temperature") in (0, 0.0):
        out.pop("temperature")
    return out


_INTEGERS = {"max_new_tokens", "min_new_tokens", "top_k", "seed", "top_n_tokens", "truncate", "best_of", "n",
             "speculate"}
_FLOATS = {"temperature", "top_p", "typical_p", "repetition_penalty", "frequency_penalty", "presence_penalty"}
_FLAGS = {"ignore_eos", "do_sample", "details", "decoder_input_details", "return_full_text", "skip_special_tokens"}


def _from_string(key: str, value: Any) -> Any:
    """Triton's vLLM backend accepts numbers and flags written as strings ({"max_tokens": "32"}); tools built
    for it (genai-perf) send them so. A string that does not parse stays a string: validation names it."""
    if not isinstance(value, str):
        return value
    try:
        if key in _INTEGERS:
            return int(value)
        if key in _FLOATS:
            return float(value)
    except ValueError:
        return value
    if key in _FLAGS and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


def _prompt(value: np.ndarray | None) -> str:
    if value is None:
        raise ValidationError("`text_input` (or `input_ids`) is required")
    return _prompt_like("text_input", value)


def _prompt_like(name: str, value: np.ndarray) -> str:
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise ValidationError(f"`{name}` must hold exactly one string. Given: {flat.size}")
    return _text(name, flat[0])


def _text(name: str, value: Any) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationError(f"`{name}` must be valid UTF-8") from None
    if isinstance(value, str):
        return value
    raise ValidationError(f"`{name}` must be a string. Given: {value!r}")


def _scalar(name: str, value: np.ndarray) -> Any:
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise ValidationError(f"`{name}` must hold exactly one value. Given: {flat.size}")
    item = flat[0]
    if isinstance(item, np.bool_ | bool):
        return bool(item)
    if isinstance(item, np.integer):
        return int(item)
    if isinstance(item, np.floating):
        # float32 tensors: 0.9 arrives as 0.899999976; round back so TGI's checks see what was sent.
        return float(np.format_float_positional(item, unique=True)) if item.dtype == np.float32 else float(item)
    if isinstance(item, bytes | str):
        return _text(name, item)
    return item
