"""The types a generate / generate_stream body must have, checked before Triton converts it.

Triton's generate extension makes each key that names an input a tensor and every other key a request
parameter. A wrong type there gets a 500 naming no field ("attempt to access JSON non-number as
double"); here it gets a 400 that names the field and the type, as TGI's validation words it.
"""

from __future__ import annotations

from typing import Any

from tgi_llm.launcher.repository import INPUTS

_INT64 = (-(2**63), 2**63 - 1)
_INT_RANGES = {"TYPE_INT32": (-(2**31), 2**31 - 1), "TYPE_INT64": _INT64, "TYPE_UINT64": (0, 2**64 - 1)}
#: Inputs that hold token ids: never negative (the engine checks the vocabulary's bound, which it knows).
TOKEN_IDS = frozenset({"input_ids"})


class BadBody(ValueError):
    """The message names the field."""


def negative_token_id(name: str, value: int) -> str:
    return f"`{name}` must hold token ids >= 0. Given: {value}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_scalar(name: str, triton_type: str, value: Any) -> None:
    if triton_type == "TYPE_STRING":
        if not isinstance(value, str):
            raise BadBody(f"`{name}` must be a string. Given: {_show(value)}")
    elif triton_type == "TYPE_BOOL":
        if not isinstance(value, bool):
            raise BadBody(f"`{name}` must be a boolean. Given: {_show(value)}")
    elif triton_type in _INT_RANGES:
        low, high = _INT_RANGES[triton_type]
        if not _is_int(value):
            raise BadBody(f"`{name}` must be an integer. Given: {_show(value)}")
        if not low <= value <= high:
            raise BadBody(f"`{name}` must be >= {low} and <= {high}. Given: {value}")
        if name in TOKEN_IDS and value < 0:
            raise BadBody(negative_token_id(name, value))
    elif triton_type == "TYPE_FP32":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadBody(f"`{name}` must be a number. Given: {_show(value)}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_generate_body(body: Any, inputs: list[tuple[str, str, list[int]]] = INPUTS) -> None:
    """Raise BadBody unless `body` is an object whose inputs and parameters Triton can convert."""
    if not isinstance(body, dict):
        raise BadBody(f"the request body must be a JSON object. Given: {type(body).__name__}")
    declared = {name: (triton_type, dims) for name, triton_type, dims in inputs}
    for name, value in body.items():
        if name in declared:
            triton_type, dims = declared[name]
            values = value if isinstance(value, list) else [value]
            if dims == [1] and len(values) != 1:
                raise BadBody(f"`{name}` must hold exactly one value. Given: {len(values)}")
            for item in values:
                _check_scalar(name, triton_type, item)
        elif isinstance(value, bool) or isinstance(value, str):
            continue
        elif _is_int(value):
            if not _INT64[0] <= value <= _INT64[1]:
                raise BadBody(f"`{name}` must be >= {_INT64[0]} and <= {_INT64[1]}. Given: {value}")
        else:
            # Triton request parameters hold only these (a float parameter is refused too).
            raise BadBody(f"`{name}` is not an input of this model, so it is sent as a request parameter, "
                          f"which must be an integer, a boolean or a string. Given: {_show(value)}")
