"""Tensors and parameters of the tgi_llm Triton model <-> the front's GenerateSpec and Chunk.

Inputs follow Triton's LLM convention (text_input, stream, exclude_input_in_output, stop, seed); every other
TGI parameter travels as a request parameter under its TGI name (exact doubles, not FP32 tensors), which the
model validates with TGI's messages. Names: model_repository/tgi_llm/config.pbtxt, tgi_llm/triton/outputs.py.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from tritonclient.grpc import InferResult, service_pb2

from tgi_llm.front.errors import FrontError
from tgi_llm.front.protocol import Chunk, GenerateSpec, TokenInfo
from tgi_llm.triton.outputs import (  # the names the model's responses use
    FINISH_REASON,
    NUM_ACCEPTED,
    NUM_CACHED,
    NUM_INPUT,
    NUM_OUTPUT,
    PAD_ID,
    PREFILL_IDS,
    PREFILL_LOGPROBS,
    PREFILL_TEXTS,
    PREFILL_TOP_IDS,
    PREFILL_TOP_LOGPROBS,
    PREFILL_TOP_TEXTS,
    SEED,
    TEXT,
    TOKEN_IDS,
    TOKEN_LOGPROBS,
    TOKEN_SPECIAL,
    TOKEN_TEXTS,
    TOP_IDS,
    TOP_LOGPROBS,
    TOP_TEXTS,
)
from tgi_llm.triton.status import ERROR_CODE_PARAMETER


def _bytes_tensor(name: str, values: list[str]) -> service_pb2.ModelInferRequest.InferInputTensor:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype="BYTES", shape=[len(values)])
    tensor.contents.bytes_contents.extend(v.encode() for v in values)
    return tensor


def _bool_tensor(name: str, value: bool) -> service_pb2.ModelInferRequest.InferInputTensor:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype="BOOL", shape=[1])
    tensor.contents.bool_contents.append(value)
    return tensor


def _ids_tensor(ids: list[int]) -> service_pb2.ModelInferRequest.InferInputTensor:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64", shape=[len(ids)])
    tensor.contents.int64_contents.extend(ids)
    return tensor


def _u64_tensor(name: str, value: int) -> service_pb2.ModelInferRequest.InferInputTensor:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype="UINT64", shape=[1])
    tensor.contents.uint64_contents.append(value)
    return tensor


def encode_request(model_name: str, spec: GenerateSpec, request_id: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model_name, id=request_id)
    params = dict(spec.parameters)
    stop = params.pop("stop", None)
    seed = params.pop("seed", None)
    prompt = _bytes_tensor("text_input", [spec.inputs]) if isinstance(spec.inputs, str) else _ids_tensor(spec.inputs)
    request.inputs.extend(
        [
            prompt,
            _bool_tensor("stream", spec.stream),
            _bool_tensor("exclude_input_in_output", True),  # the front adds the prompt itself when asked
        ]
    )
    if stop:
        request.inputs.append(_bytes_tensor("stop", list(stop)))
    if isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**64:
        request.inputs.append(_u64_tensor("seed", seed))  # u64: a request parameter is only int64
    elif isinstance(seed, int) and seed >= 2**64:  # no Triton type holds it: TGI's message from here
        raise FrontError(f"`seed` must be >= 0 and <= {2**64 - 1}. Given: {seed}", "validation")
    elif seed is not None:
        params["seed"] = seed  # negative: the model rejects it with TGI's message
    for key, value in params.items():
        _set_parameter(request.parameters[key], key, value)
    request.parameters[ERROR_CODE_PARAMETER].bool_param = True  # errors name their code (triton/status.py)
    return request


def _set_parameter(param: Any, key: str, value: Any) -> None:
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise FrontError(f"`{key}` must be >= {-(2**63)} and < {2**63}. Given: {value}", "validation")
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    elif isinstance(value, str):
        param.string_param = value
    else:  # a JSON object or array (TGI's `grammar`): as its JSON text; the model validates it by name
        param.string_param = json.dumps(value)


def _array(result: InferResult, name: str) -> np.ndarray | None:
    arr = result.as_numpy(name)
    return None if arr is None else arr.reshape(-1)


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _scalar(result: InferResult, name: str) -> Any:
    arr = result.as_numpy(name)
    if arr is None or arr.size == 0:
        return None
    return arr.reshape(-1)[0]


def _tokens(result: InferResult, ids: str, texts: str, logprobs: str, special: str | None) -> list[TokenInfo]:
    id_arr = _array(result, ids)
    if id_arr is None:
        return []
    text_arr = _array(result, texts)
    lp_arr = _array(result, logprobs)
    sp_arr = _array(result, special) if special else None
    out = []
    for i, token_id in enumerate(id_arr.tolist()):
        lp = None if lp_arr is None or i >= lp_arr.size else float(lp_arr[i])
        out.append(
            TokenInfo(
                id=int(token_id),
                text=_text(text_arr[i]) if text_arr is not None and i < text_arr.size else "",
                logprob=None if lp is None or np.isnan(lp) else lp,
                special=bool(sp_arr[i]) if sp_arr is not None and i < sp_arr.size else False,
            )
        )
    return out


def _top_tokens(result: InferResult, names: tuple[str, str, str] = (TOP_IDS, TOP_TEXTS, TOP_LOGPROBS)
                ) -> list[list[TokenInfo]]:
    ids = result.as_numpy(names[0])
    if ids is None or ids.size == 0:
        return []
    ids = ids.reshape(ids.shape[0] if ids.ndim > 1 else 1, -1)
    texts = result.as_numpy(names[1])
    lps = result.as_numpy(names[2])
    texts = texts.reshape(ids.shape) if texts is not None else None
    lps = lps.reshape(ids.shape) if lps is not None else None
    return [
        [
            TokenInfo(
                int(ids[r, c]),
                _text(texts[r, c]) if texts is not None else "",
                float(lps[r, c]) if lps is not None else None,
            )
            for c in range(ids.shape[1]) if ids[r, c] != PAD_ID  # a row shorter than top_n_tokens
        ]
        for r in range(ids.shape[0])
    ]


def decode_response(result: InferResult, final: bool) -> Chunk:
    text = _scalar(result, TEXT)
    reason = _scalar(result, FINISH_REASON)
    reason = _text(reason) if reason is not None else None
    final = final or bool(reason)
    n_in = _scalar(result, NUM_INPUT)
    n_out = _scalar(result, NUM_OUTPUT)
    n_cached = _scalar(result, NUM_CACHED)
    n_accepted = _scalar(result, NUM_ACCEPTED)
    seed = _scalar(result, SEED)
    return Chunk(
        text=_text(text) if text is not None else "",
        tokens=_tokens(result, TOKEN_IDS, TOKEN_TEXTS, TOKEN_LOGPROBS, TOKEN_SPECIAL),
        top_tokens=_top_tokens(result),
        final=final,
        finish_reason=reason or None,
        input_tokens=int(n_in) if n_in is not None else None,
        generated_tokens=int(n_out) if n_out is not None else None,
        cached_tokens=int(n_cached) if n_cached is not None else None,
        accepted_draft_tokens=int(n_accepted) if n_accepted is not None else None,
        seed=int(seed) if seed is not None and final else None,
        prefill=_prefill(result) if final else [],
    )


def _prefill(result: InferResult) -> list[TokenInfo]:
    """The prompt tokens; their logprobs (and best alternatives) come for tokens 2.. only."""
    tokens = _tokens(result, PREFILL_IDS, PREFILL_TEXTS, PREFILL_LOGPROBS, None)
    if not tokens:
        return []
    lps = _array(result, PREFILL_LOGPROBS)
    tops = _top_tokens(result, (PREFILL_TOP_IDS, PREFILL_TOP_TEXTS, PREFILL_TOP_LOGPROBS))
    out = [TokenInfo(tokens[0].id, tokens[0].text, None)]
    for i, t in enumerate(tokens[1:]):
        lp = float(lps[i]) if lps is not None and i < lps.size else None
        out.append(TokenInfo(t.id, t.text, lp, top=tops[i] if i < len(tops) else []))
    return out


def merge_final(first: Chunk, second: Chunk) -> Chunk:
    """A last token response and the (usually empty) response carrying the final flag, as one Chunk."""
    return Chunk(
        text=first.text + second.text,
        tokens=first.tokens + second.tokens,
        top_tokens=first.top_tokens + second.top_tokens,
        final=True,
        finish_reason=second.finish_reason or first.finish_reason,
        input_tokens=second.input_tokens if second.input_tokens is not None else first.input_tokens,
        generated_tokens=second.generated_tokens if second.generated_tokens is not None else first.generated_tokens,
        cached_tokens=second.cached_tokens if second.cached_tokens is not None else first.cached_tokens,
        accepted_draft_tokens=second.accepted_draft_tokens if second.accepted_draft_tokens is not None
        else first.accepted_draft_tokens,
        seed=second.seed if second.seed is not None else first.seed,
        prefill=second.prefill or first.prefill,
    )
