"""Sending fuzz cases to a live server and judging what comes back.

The oracle, for every request: a success (2xx with a well-formed, strict-JSON body or stream that ends
properly; a gRPC stream that ends with exactly one final response) or a client error (4xx, gRPC
INVALID_ARGUMENT, an in-stream error) whose message names a field of the request; never a 5xx, another gRPC
status, a non-JSON error or a hang. Plus semantic checks for requests that must not be silently served
(`tool_choice` without tools, `best_of` on /v1/completions) and for grammar output that ended by EOS.
"""

from __future__ import annotations

import json
import math
import queue
import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.fuzz.strategies import GrpcCase, HttpCase

#: Hang guard per request (the slowest legitimate case, a 1.9 MB body on 2 busy cores, takes a few seconds).
TIMEOUT_S = 60.0
#: /health must answer within this while fuzz requests run (a blocked event loop stalled it ~9 s).
HEALTH_BOUND_S = 2.0

#: Fields a message may name although the request lacks them: the required inputs of each API.
REQUIRED = {"inputs", "prompt", "messages", "text_input", "input_ids"}
#: What the server may call a request's field by instead (TGI's name for an OpenAI/Triton one, and back).
ALIASES = {
    "max_tokens": {"max_new_tokens"}, "max_new_tokens": {"max_tokens"}, "max_completion_tokens": {"max_new_tokens"},
    "min_tokens": {"min_new_tokens"}, "min_length": {"min_new_tokens"}, "prompt": {"inputs"},
    "messages": {"inputs", "chat_template", "template", "role", "content"},
    "response_format": {"grammar", "json_schema", "schema"}, "tools": {"grammar", "tool_choice"},
    "tool_choice": {"grammar", "tools"}, "guided_decoding_guide": {"grammar"},
    "guided_decoding_guide_type": {"grammar"}, "logprobs": {"top_n_tokens", "details"},
    "top_logprobs": {"top_n_tokens"}, "n": {"best_of"}, "best_of": {"n"}, "text_input": {"inputs"},
    "input_ids": {"inputs"}, "sampling_parameters": {"temperature", "top_p", "top_k", "max_new_tokens", "seed"},
    "stream_options": {"stream"}, "parameters": {"temperature", "top_p", "max_new_tokens", "seed", "stop"},
}
#: Words a parse error of a body that is not strict JSON in UTF-8 may name instead of a field.
PARSE_WORDS = {"json", "utf-8", "utf8", "unicode", "nan", "infinity", "body", "surrogate", "decode"}


def names_field(message: str, keys: set[str], strict: bool = True) -> bool:
    """Whether `message` names one of `keys` (or an alias, or a required input) as a whole word."""
    quoted = {k or '""' for k in keys}  # an empty key is written ""
    if any(f"`{k}`" in message or f"`{k}." in message for k in quoted):  # quoted as the server quotes fields
        return True
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message.lower()))
    wanted = {k.lower() for k in keys if len(k) > 1} | REQUIRED
    for key in list(wanted):
        wanted |= ALIASES.get(key, set())
    if not strict:
        wanted |= PARSE_WORDS
    return bool(words & wanted)


def strict_json(text: str | bytes) -> Any:
    """json.loads refusing NaN/Infinity: what JavaScript and most JSON clients accept."""

    def refuse(token: str) -> Any:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


# ---- HTTP ----


@dataclass
class HttpResult:
    status: int
    body: bytes = b""
    events: list[str] | None = None  # SSE `data:` payloads, for an event stream
    elapsed_s: float = 0.0


def http_send(client: httpx.Client, base: str, case: HttpCase, timeout_s: float = TIMEOUT_S) -> HttpResult:
    """POST the case; an event stream is read to its end; the whole exchange within `timeout_s` (a hang raises
    AssertionError)."""
    t0 = time.monotonic()
    try:
        with client.stream("POST", base + case.route, content=case.encode(), timeout=timeout_s,
                           headers={"Content-Type": "application/json"}) as r:
            if not r.headers.get("content-type", "").startswith("text/event-stream"):
                return HttpResult(r.status_code, r.read(), None, time.monotonic() - t0)
            events = []
            for line in r.iter_lines():
                if time.monotonic() - t0 > timeout_s:
                    raise AssertionError(f"stream still open after {timeout_s:.0f} s: {case!r}")
                if line.startswith("data:"):
                    events.append(line[5:].strip())
            return HttpResult(r.status_code, b"", events, time.monotonic() - t0)
    except httpx.TimeoutException as exc:
        raise AssertionError(f"no answer within {timeout_s:.0f} s ({exc!r}): {case!r}") from None


def error_message(payload: Any) -> str | None:
    """TGI's {"error": str}, OpenAI's {"error": {"message": str}}, Triton's {"error": str}."""
    if isinstance(payload, dict):
        err = payload.get("error")
        if isinstance(err, str):
            return err
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
    return None


def check_http(case: HttpCase, result: HttpResult) -> None:
    """Raise AssertionError (with a reproducer) unless the response is acceptable for the case."""
    where = f"{case!r} -> {result.status} {(result.body or repr(result.events).encode())[:600]!r}"
    assert result.status < 500, f"server error: {where}"
    if result.status in (413, 429):  # over the payload limit / overloaded: refusals with no field to name
        return
    if result.status >= 400:
        try:
            payload = strict_json(result.body) if result.events is None else None
        except ValueError:
            raise AssertionError(f"error body is not JSON: {where}") from None
        message = error_message(payload) if payload is not None else "".join(result.events or [])
        assert message is not None, f"error without a message: {where}"
        if case.route.endswith("/infer") and "decoupled" in message:
            return  # the route itself is refused for this model, whatever the body holds
        if "a key of `" in message and "surrogate" in message:
            return  # a key that is no valid text cannot be named, only where it is
        assert names_field(message, case.keys(), case.strict()), f"error names no field of the request: {where}"
        return
    assert 200 <= result.status < 300, f"unexpected status: {where}"
    semantic(case, where)
    if result.events is not None:
        check_stream(case, result.events, where)
    else:
        try:
            payload = strict_json(result.body)
        except ValueError as exc:
            raise AssertionError(f"success body is not strict JSON ({exc}): {where}") from None
        check_body(case, payload, where)


def semantic(case: HttpCase, where: str) -> None:
    """Requests the server must not answer 200 as if the field were absent."""
    body = case.body if isinstance(case.body, dict) else {}
    if case.route == "/v1/chat/completions" and body.get("tool_choice") in ("required", "any") or isinstance(
            body.get("tool_choice"), dict):
        assert body.get("tools"), f"`tool_choice` without `tools` served as if absent: {where}"


def check_body(case: HttpCase, payload: Any, where: str) -> None:
    route = case.route
    if route == "/tokenize":
        assert isinstance(payload, list) and all(isinstance(t, dict) and isinstance(t.get("id"), int)
                                                 for t in payload), f"bad /tokenize answer: {where}"
        return
    if route in ("/generate", "/"):
        items = payload if route == "/" and isinstance(payload, list) else [payload]
        for item in items:
            assert isinstance(item, dict) and isinstance(item.get("generated_text"), str), f"bad answer: {where}"
            details = item.get("details") or {}
            check_grammar(case, item["generated_text"], details.get("finish_reason"), where)
        return
    if route.startswith("/v1/"):
        choices = payload.get("choices") if isinstance(payload, dict) else None
        assert isinstance(choices, list) and choices, f"no choices: {where}"
        for choice in choices:
            assert choice.get("finish_reason") in ("stop", "length", "tool_calls", "content_filter"), where
            text = choice.get("text") if route == "/v1/completions" else (choice.get("message") or {}).get("content")
            check_grammar(case, text, choice["finish_reason"], where)
        body = case.body
        best_of = body.get("best_of") if route == "/v1/completions" else None
        if isinstance(best_of, int) and not isinstance(best_of, bool) and best_of > 1:
            # OpenAI generates best_of candidates and bills them all: an ignored best_of shows here.
            used = (payload.get("usage") or {}).get("completion_tokens", 0)
            assert used >= best_of * (len(choices) // max(1, int(body.get("n") or 1))), \
                f"`best_of` {best_of} ignored (completion_tokens {used}): {where}"
        return
    if route.endswith("/generate"):
        assert isinstance(payload, dict) and isinstance(payload.get("text_output"), str), f"bad answer: {where}"
        check_grammar(case, payload["text_output"], payload.get("finish_reason"), where)


def check_stream(case: HttpCase, events: list[str], where: str) -> None:
    """Every event strict JSON; an error event only last, naming a field; the stream's end as the API says."""
    assert events, f"empty event stream: {where}"
    route = case.route
    openai = route.startswith("/v1/")
    if openai:
        assert events[-1] == "[DONE]", f"stream does not end with [DONE]: {where}"
        events = events[:-1]
    parsed = []
    for i, event in enumerate(events):
        try:
            item = strict_json(event)
        except ValueError as exc:
            raise AssertionError(f"event {i} is not strict JSON ({exc}): {where}") from None
        message = error_message(item)
        if message is not None:
            assert i == len(events) - 1, f"events after an error event: {where}"
            assert names_field(message, case.keys(), case.strict()), f"in-stream error names no field: {where}"
            return
        parsed.append(item)
    if openai:
        finals: dict[int, int] = {}
        texts: dict[int, str] = {}
        for item in parsed:
            for choice in item.get("choices") or []:
                k = choice.get("index", 0)
                piece = choice.get("text") if route == "/v1/completions" else (choice.get("delta") or {}).get(
                    "content")
                texts[k] = texts.get(k, "") + (piece or "")
                if choice.get("finish_reason") is not None:
                    finals[k] = finals.get(k, 0) + 1
                    check_grammar(case, texts[k], choice["finish_reason"], where)
        assert finals and all(n == 1 for n in finals.values()), f"not one finish_reason per choice {finals}: {where}"
        assert set(finals) == set(texts), f"a choice never finished: {where}"
    elif route.startswith("/v2/"):
        assert parsed and parsed[-1].get("finish_reason"), f"stream ends without finish_reason: {where}"
        assert all(not e.get("finish_reason") for e in parsed[:-1]), f"finish_reason before the end: {where}"
        check_grammar(case, "".join(e.get("text_output") or "" for e in parsed), parsed[-1]["finish_reason"], where)
    else:  # TGI: only the last event carries generated_text
        finals = [e for e in parsed if e.get("generated_text") is not None]
        assert len(finals) == 1 and finals[0] is parsed[-1], f"not exactly one final event, last: {where}"
        details = parsed[-1].get("details") or {}
        check_grammar(case, parsed[-1]["generated_text"], details.get("finish_reason"), where)


def grammar_of(case: HttpCase) -> tuple[str, Any] | None:
    """(kind, spec) of the grammar the request asks for: "json" (a schema, None = any), "object", "regex"."""
    body = case.body if isinstance(case.body, dict) else {}
    if case.route.startswith("/v1/"):
        if body.get("tools") or "stop" in body or body.get("echo"):
            return None
        fmt = body.get("response_format")
        if isinstance(fmt, dict):
            if fmt.get("type") == "json_object":
                return ("object", None)
            if fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), dict):
                return ("json", fmt["json_schema"].get("schema"))
            if fmt.get("type") == "json":
                return ("json", fmt.get("value"))
        return None
    if case.route.startswith("/v2/"):
        if "stop" in body or body.get("exclude_input_in_output") is False or body.get("return_full_text"):
            return None
        kind, guide = body.get("guided_decoding_guide_type"), body.get("guided_decoding_guide")
        if kind == "json":
            try:
                return ("json", json.loads(guide) if guide else None)
            except (TypeError, ValueError):
                return None
        if kind == "regex":
            return ("regex", guide)
        return None
    params = body.get("parameters")
    if not isinstance(params, dict) or "stop" in params or params.get("return_full_text"):
        return None
    grammar = params.get("grammar")
    if isinstance(grammar, dict) and grammar.get("type") in ("json", "json_object", "regex"):
        return ("regex" if grammar["type"] == "regex" else "json", grammar.get("value"))
    return None


def check_grammar(case: HttpCase, text: Any, finish_reason: Any, where: str) -> None:
    """Output that ended by end-of-sequence under a grammar must match it (cut by `length`, it may not yet)."""
    spec = grammar_of(case)
    if spec is None or finish_reason not in ("eos_token", "stop") or not isinstance(text, str):
        return
    kind, value = spec
    if kind == "regex":
        try:
            pattern = re.compile(value)
        except (re.error, TypeError):
            return  # Python reads this regex otherwise than the grammar engine: nothing to compare with
        assert pattern.fullmatch(text), f"output does not match the regex {value!r}: {text!r}: {where}"
        return
    try:
        decoded = json.loads(text)
    except ValueError:
        raise AssertionError(f"output under a JSON grammar is not JSON: {text!r}: {where}") from None
    if kind == "object":
        assert isinstance(decoded, dict), f"json_object output is not an object: {text!r}: {where}"
    elif isinstance(value, (dict, bool)):
        import jsonschema

        try:
            jsonschema.validate(decoded, value)
        except jsonschema.ValidationError as exc:
            raise AssertionError(f"output breaks its schema ({exc.message}): {text!r}: {where}") from None
        except Exception:  # noqa: BLE001 - a schema jsonschema cannot use (bad $ref, ...): nothing to compare
            return


# ---- gRPC ----


def build_request(case: GrpcCase, model: str = "tgi_llm") -> Any:
    """The raw ModelInferRequest: names, datatypes, shapes and bytes exactly as the case says."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, id=case.request_id)
    for name, value in case.parameters.items():
        param = request.parameters[name]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:  # protobuf strings must be valid UTF-8: a lone surrogate becomes U+FFFD here
            param.string_param = value.encode("utf-8", "replace").decode()
    typed = not case.use_raw and all(t.datatype not in ("FP16", "BF16") for t in case.tensors)
    for t in case.tensors:
        tensor = request.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        if typed:
            _set_contents(tensor.contents, t.datatype, t.values)
        else:
            request.raw_input_contents.append(t.raw or b"")
    return request


def _set_contents(contents: Any, datatype: str, values: list[Any]) -> None:
    def wrap(v: Any, bits: int, signed: bool) -> int:
        v = int(v) % (1 << bits)
        return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v

    if datatype == "BYTES":
        contents.bytes_contents.extend(v if isinstance(v, bytes) else str(v).encode() for v in values)
    elif datatype == "BOOL":
        contents.bool_contents.extend(bool(v) for v in values)
    elif datatype in ("INT8", "INT16", "INT32"):
        contents.int_contents.extend(wrap(v, 32, True) for v in values)
    elif datatype == "INT64":
        contents.int64_contents.extend(wrap(v, 64, True) for v in values)
    elif datatype in ("UINT8", "UINT16", "UINT32"):
        contents.uint_contents.extend(wrap(v, 32, False) for v in values)
    elif datatype == "UINT64":
        contents.uint64_contents.extend(wrap(v, 64, False) for v in values)
    elif datatype == "FP32":
        contents.fp32_contents.extend(float(v) for v in values)
    elif datatype == "FP64":
        contents.fp64_contents.extend(float(v) for v in values)


@dataclass
class GrpcResult:
    responses: list[Any] = field(default_factory=list)  # ModelInferResponse, in order
    stream_errors: list[str] = field(default_factory=list)  # in-stream error_message
    code: Any = None  # grpc.StatusCode the call ended with (None: OK)
    details: str = ""
    elapsed_s: float = 0.0

    def finals(self) -> int:
        return sum(r.parameters["triton_final_response"].bool_param for r in self.responses
                   if "triton_final_response" in r.parameters)


class GrpcStreams:
    """One channel to the gateway; each call opens its own ModelStreamInfer stream."""

    def __init__(self, target: str) -> None:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def run(self, requests: list[Any], status_header: bool = True, timeout_s: float = TIMEOUT_S,
            expect_finals: int | None = None, grace_s: float = 0.3) -> GrpcResult:
        """Send `requests` on one stream and read until each has its final response (or an error), then wait
        `grace_s` for anything extra before closing our side. A stream open past `timeout_s` is a hang."""
        import grpc

        expect = len(requests) if expect_finals is None else expect_finals
        done = threading.Event()

        def outgoing():
            yield from requests
            done.wait(timeout_s + 5)  # keep our side open: closing it early may end the stream

        metadata = [("triton_grpc_error", "true")] if status_header else None
        result = GrpcResult()
        t0 = time.monotonic()
        call = self.stub.ModelStreamInfer(outgoing(), metadata=metadata, timeout=timeout_s)
        ended = threading.Event()

        def read():
            try:
                for message in call:
                    if message.error_message:
                        result.stream_errors.append(message.error_message)
                    else:
                        result.responses.append(message.infer_response)
                    if result.finals() + len(result.stream_errors) >= expect:
                        ended.set()
            except grpc.RpcError as exc:
                result.code, result.details = exc.code(), exc.details() or ""
            finally:
                ended.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        ended.wait(timeout_s + 1)
        if result.code is None and reader.is_alive():
            time.sleep(grace_s)  # a second final, or anything after the final, would arrive now
        done.set()
        call.cancel()
        reader.join(10)
        result.elapsed_s = time.monotonic() - t0
        if result.code == grpc.StatusCode.CANCELLED:  # our own cancel after the end
            result.code = None
        return result


def check_grpc(case: GrpcCase, result: GrpcResult) -> None:
    import grpc

    where = (f"{case!r} -> code={result.code} details={result.details[:300]!r} "
             f"stream_errors={[e[:300] for e in result.stream_errors]!r} responses={len(result.responses)}")
    assert result.code != grpc.StatusCode.DEADLINE_EXCEEDED, f"hang: no end within {TIMEOUT_S:.0f} s: {where}"
    if result.code is not None:
        assert result.code == grpc.StatusCode.INVALID_ARGUMENT, f"status other than INVALID_ARGUMENT: {where}"
        assert names_field(result.details, case.names()), f"error names no input: {where}"
        assert not result.responses, f"responses before an error status: {where}"
        return
    if result.stream_errors:
        assert len(result.stream_errors) == 1 and result.finals() == 0, f"error plus other ends: {where}"
        assert names_field(result.stream_errors[0], case.names()), f"in-stream error names no input: {where}"
        return
    assert result.finals() == 1, f"{result.finals()} final responses (want exactly 1): {where}"
    last = result.responses[-1]
    assert last.parameters["triton_final_response"].bool_param, f"responses after the final one: {where}"
    reasons = [o for o in last.outputs if o.name == "finish_reason"]
    assert reasons or not last.outputs, f"final response without finish_reason: {where}"


# ---- the server meanwhile ----


class HealthWatch:
    """Probes /health (front) and /v2/health/ready (gateway) from a thread, every `period_s`, recording how
    long each took; a probe is bounded by a generous timeout so a stall is measured, not waited out."""

    def __init__(self, urls: list[str], period_s: float = 0.2) -> None:
        self.urls, self.period_s = urls, period_s
        self.probes: list[tuple[str, float, float, int]] = []  # (url, start, seconds, status)
        self.inflight: dict[str, float] = {}
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=self._probe, args=(u,), daemon=True) for u in urls]

    def __enter__(self) -> HealthWatch:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(35)

    def _probe(self, url: str) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop_event.is_set():
                t0 = time.monotonic()
                self.inflight[url] = t0
                try:
                    status = client.get(url).status_code
                except httpx.HTTPError:
                    status = 0
                self.probes.append((url, t0, time.monotonic() - t0, status))
                self.inflight.pop(url, None)
                self.stop_event.wait(self.period_s)

    def slow_since(self, t0: float, bound_s: float = HEALTH_BOUND_S) -> list[str]:
        """Probes since `t0` that took over `bound_s` or failed; waits (bounded) for any still in flight."""
        deadline = time.monotonic() + 30
        while self.inflight and time.monotonic() < deadline and any(
                time.monotonic() - s <= bound_s for s in list(self.inflight.values())):
            time.sleep(0.02)
        slow = [f"{u} took {time.monotonic() - s:.1f} s and is still open" for u, s in list(self.inflight.items())
                if time.monotonic() - s > bound_s]
        slow += [f"{u} took {d:.1f} s (status {c})" for u, s, d, c in list(self.probes)
                 if s + d >= t0 and (d > bound_s or c != 200)]
        return slow


_LINE = re.compile(r"^([\w:]+)(?:\{[^}]*\})? (\S+)$")


def gauges(metrics_url: str) -> dict[str, float]:
    """The unlabelled gauges of the Prometheus page (tgi_queue_size, tgi_kv_blocks_used, ...)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and "{" not in line:
            value = float(m.group(2))
            out[m.group(1)] = value if math.isfinite(value) else -1.0
    return out


def drained(metrics_url: str, timeout_s: float = 60.0) -> dict[str, float]:
    """Poll until queue, batch and used KV blocks are all zero (a hang guard, not a timing); the last values."""
    names = ("tgi_queue_size", "tgi_batch_current_size", "tgi_kv_blocks_used")
    deadline = time.monotonic() + timeout_s
    while True:
        values = gauges(metrics_url)
        now = {n: values.get(n, 0.0) for n in names}
        if not any(now.values()) or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def drain_queue(q: queue.Queue) -> list[Any]:
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items
