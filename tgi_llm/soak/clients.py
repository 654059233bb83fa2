"""One planned request over each protocol, as a client would send it, and what came back: how many final
responses (the last of a success, or an error), whether it succeeded, the tokens the server reported.

Each worker thread keeps its own clients (a gRPC connection, an HTTP connection pool, an OpenAI client).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tgi_llm.soak.plan import Planned

MODEL = "tgi_llm"
TIMEOUT_S = 300.0  # hang guard for one response
INVALID = {"top_p": 1.5}  # refused by the model's validation, whatever the protocol


@dataclass
class Result:
    index: int
    protocol: str
    kind: str
    stream: bool
    finals: int = 0  # final responses seen: exactly one, unless the client cancelled first
    ok: bool = False
    error: str | None = None  # gRPC status, "HTTP <code>", or the error's text
    tokens: int | None = None  # generated tokens, as the server reported them
    cancelled: bool = False  # the client went away after the first token
    seconds: float = 0.0


@dataclass(frozen=True)
class Targets:
    grpc: str  # host:port
    http: str  # http://host:port (Triton's HTTP)
    front: str | None  # http://host:port (TGI/OpenAI front), None to skip the openai protocol


_local = threading.local()


def run(targets: Targets, p: Planned) -> Result:
    result = Result(p.index, p.protocol, p.kind, p.stream)
    start = time.monotonic()
    try:
        {"grpc": _grpc, "http": _http, "openai": _openai}[p.protocol](targets, p, result)
    except Exception as exc:  # a broken connection, a timeout: recorded, never fatal to the soak
        result.error = result.error or f"{type(exc).__name__}: {exc}"
    result.seconds = time.monotonic() - start
    return result


# ---- Triton gRPC: one stream per request, errors with their status (triton_grpc_error) ----

def _grpc_client(url: str) -> Any:
    import tritonclient.grpc as grpcclient

    client = getattr(_local, "grpc", None)
    if client is None:
        client = _local.grpc = grpcclient.InferenceServerClient(url)
    return client


def _grpc_inputs(p: Planned) -> list:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    values: dict[str, np.ndarray] = {
        "text_input": np.array([p.prompt.encode()], dtype=np.object_),
        "stream": np.array([p.stream]),
        "max_tokens": np.array([p.max_tokens], dtype=np.int32),
    }
    if p.kind == "cancel":
        values["ignore_eos"] = np.array([True])
    if p.kind == "invalid":
        values["top_p"] = np.array([INVALID["top_p"]], dtype=np.float32)
    inputs = []
    for name, array in values.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _grpc(targets: Targets, p: Planned, r: Result) -> None:
    client = _grpc_client(targets.grpc)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)),
                        headers={"triton_grpc_error": "true"})
    try:
        client.async_stream_infer(MODEL, _grpc_inputs(p))
        while True:
            result, error = responses.get(timeout=TIMEOUT_S)
            if _grpc_seen(r, result, error):
                break
            if p.kind == "cancel":
                r.cancelled = True
                client.stop_stream(cancel_requests=True)
                return
    finally:
        if not r.cancelled:
            client.stop_stream()  # graceful: anything still sent on this stream lands in `responses` first
    while not responses.empty():  # a second final would show here
        _grpc_seen(r, *responses.get())


def _grpc_seen(r: Result, result: Any, error: Any) -> bool:
    """Count one response; True if it was a final one."""
    if error is not None:
        r.finals += 1
        r.error = error.status() or error.message()
        return True
    if not result.get_response().parameters["triton_final_response"].bool_param:
        return False
    r.finals += 1
    r.ok = r.finals == 1 and r.error is None
    count = result.as_numpy("num_output_tokens")
    r.tokens = int(count.reshape(-1)[0]) if count is not None else r.tokens
    return True


# ---- Triton HTTP: generate, or generate_stream as server-sent events ----

def _http_client() -> Any:
    import httpx

    client = getattr(_local, "http", None)
    if client is None:
        client = _local.http = httpx.Client(timeout=TIMEOUT_S)
    return client


def _http(targets: Targets, p: Planned, r: Result) -> None:
    body: dict[str, Any] = {"text_input": p.prompt, "max_tokens": p.max_tokens, "stream": p.stream}
    if p.kind == "cancel":
        body["ignore_eos"] = True
    if p.kind == "invalid":
        body |= INVALID
    client = _http_client()
    route = "generate_stream" if p.stream else "generate"
    with client.stream("POST", f"{targets.http}/v2/models/{MODEL}/{route}", json=body) as response:
        if response.status_code != 200:
            response.read()
            r.finals, r.error = 1, f"HTTP {response.status_code}"
            return
        if not p.stream:
            reply = json.loads(response.read())
            r.finals, r.ok, r.tokens = 1, True, reply.get("num_output_tokens")
            return
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[len("data:"):])
            if "error" in event:
                r.finals += 1
                r.error = event["error"]
            elif "finish_reason" in event:
                r.finals += 1
                r.ok = r.finals == 1 and r.error is None
                r.tokens = event.get("num_output_tokens")
            elif p.kind == "cancel":
                r.cancelled = True
                return  # leaving the block closes the connection: the server cancels the request


# ---- OpenAI front: completions and chat completions, streamed or not ----

def _openai_client(front: str) -> Any:
    import openai

    client = getattr(_local, "openai", None)
    if client is None:
        client = _local.openai = openai.OpenAI(base_url=f"{front}/v1", api_key="soak", max_retries=0,
                                               timeout=TIMEOUT_S)
    return client


def _openai(targets: Targets, p: Planned, r: Result) -> None:
    import openai

    client = _openai_client(targets.front)
    extra = dict(INVALID) if p.kind == "invalid" else {}
    chat = p.index % 2 == 1
    try:
        if chat:
            call = client.chat.completions.create
            kwargs = {"messages": [{"role": "user", "content": p.prompt}]}
        else:
            call = client.completions.create
            kwargs = {"prompt": p.prompt}
        kwargs |= {"model": "tgi", "max_tokens": p.max_tokens, **extra}
        if not p.stream:
            reply = call(**kwargs)
            r.finals, r.ok, r.tokens = 1, True, reply.usage.completion_tokens
            return
        with call(**kwargs, stream=True, stream_options={"include_usage": True}) as stream:
            for chunk in stream:
                if chunk.usage is not None:
                    r.tokens = chunk.usage.completion_tokens
                if any(choice.finish_reason is not None for choice in chunk.choices):
                    r.finals += 1
                    r.ok = r.finals == 1
                elif p.kind == "cancel" and chunk.choices:
                    r.cancelled = True
                    return  # leaving the block closes the stream: the front cancels the Triton request
    except openai.APIStatusError as exc:
        r.finals += 1
        r.ok = False
        r.error = f"HTTP {exc.status_code}"
    except openai.APIError as exc:  # an error event inside the stream
        r.finals += 1
        r.ok = False
        r.error = str(exc)
