"""Hypothesis strategies for hostile requests: TGI, OpenAI and Triton HTTP bodies, and raw gRPC tensors.

Every value a client can send is drawn from "plausible" (what a real client sends) or "hostile" (lone
surrogates, invalid UTF-8, non-finite floats, integers past int64, wrong types, deep nesting, huge texts).
Generation stays cheap: the token budget fields (`max_new_tokens`, `max_tokens`, ...) are always present and
are either 1-4 or values the server must refuse, never a default or a large valid budget.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

#: SmolLM2's vocabulary size: ids below it are valid.
VOCAB = 49152


@dataclass(frozen=True)
class Raw:
    """A JSON token written verbatim: NaN, Infinity, -Infinity or 1e999 (which Python's json reads as inf)."""

    text: str


@dataclass(frozen=True)
class HttpCase:
    """One HTTP request: `body` (with Raw tokens) is encoded as JSON; `utf8` False writes lone surrogates as
    raw (invalid UTF-8) bytes instead of \\u escapes."""

    route: str
    body: Any
    utf8: bool = True

    def encode(self) -> bytes:
        return encode_json(self.body, self.utf8)

    def strict(self) -> bool:
        """Whether the body is standard JSON in valid UTF-8 (else a parse error need not name a field)."""
        return not _has_raw(self.body) and (self.utf8 or not _has_surrogate(self.body))

    def keys(self) -> set[str]:
        return _keys(self.body)

    def __repr__(self) -> str:  # a reproducer: what to POST where
        return f"HttpCase({self.route!r}, body={self.encode()[:2000]!r})"


def encode_json(value: Any, utf8: bool = True) -> bytes:
    """JSON text for `value`; Raw tokens verbatim; non-finite floats as NaN/Infinity literals."""

    def enc(v: Any) -> str:
        if isinstance(v, Raw):
            return v.text
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        if isinstance(v, dict):
            return "{" + ",".join(f"{enc(str(k))}:{enc(x)}" for k, x in v.items()) + "}"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(enc(x) for x in v) + "]"
        if isinstance(v, str) and not utf8:
            return json.dumps(v, ensure_ascii=False)
        return json.dumps(v)

    text = enc(value)
    return text.encode("utf-8", "surrogatepass") if not utf8 else text.encode("ascii", "backslashreplace")


def _walk(value: Any):
    yield value
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _walk(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk(v)


def _has_raw(value: Any) -> bool:
    return any(isinstance(v, Raw) or (isinstance(v, float) and not math.isfinite(v)) for v in _walk(value))


def _has_surrogate(value: Any) -> bool:
    return any(isinstance(v, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in v) for v in _walk(value))


def _keys(value: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            out.add(str(k))
            out |= _keys(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out |= _keys(v)
    return out


def weighted(common: st.SearchStrategy, rare: st.SearchStrategy, one_in: int) -> st.SearchStrategy:
    """`rare` about once in `one_in` draws (st.one_of would pick it half the time)."""
    return st.integers(0, one_in - 1).flatmap(lambda i: rare if i == 0 else common)


# ---- values ----

SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\udc00b", "\ud83d", "\udbff\udfff"])
#: Text with everything Unicode has, surrogates included (st.text leaves them out by default).
ANY_CHAR = st.characters(codec=None, exclude_categories=())
SMALL_TEXT = st.one_of(
    st.text(max_size=24),
    st.text(ANY_CHAR, max_size=12),
    st.sampled_from(["Hello", "The capital of France is", "", " ", "\x00", "<|im_end|>", "<|endoftext|>",
                     "🙂" * 3, "\u202e\u200b", "{\"", "\\u0000"]),
    SURROGATES,
)
#: Texts up to ~1.9 MB (just under the 2 MB payload limit): tokenizing them must not stall the server.
HUGE_TEXT = st.builds(lambda unit, size: unit * (size // len(unit.encode())),
                      st.sampled_from(["hello ", "a", "é", "{\"a\":", "🙂"]),
                      st.sampled_from([70_000, 600_000, 1_900_000]))
TEXT = weighted(SMALL_TEXT, HUGE_TEXT, 25)

NON_FINITE = st.sampled_from([Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e999"), Raw("-1e999")])
HUGE_INTS = st.sampled_from([-1, -(2**31), 2**31, 2**32, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, -(10**30)])


def nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


DEEP = st.sampled_from([nested(30), nested(40), nested(70), nested(200)])
#: Anything a hostile client may put in any field.
HOSTILE = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 0.5, -0.0, 1e308, 5e-324, "", "1", "abc", [], {}, [1], {"a": 1}]),
    NON_FINITE, HUGE_INTS, SURROGATES, DEEP, st.text(ANY_CHAR, max_size=8),
    st.floats(allow_nan=True, allow_infinity=True),
)
#: What a token budget may hold: 1-4 (cheap) or something the server must refuse (never a default: null or a
#: missing field means hundreds of tokens).
BUDGET = weighted(st.integers(1, 4), st.sampled_from(
    [0, -1, 513, 100_000, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 1.5, 1e300, "abc", "", "\ud800", [], {}, [2],
     Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e999")]), 4)
TOKEN_ID = weighted(st.integers(0, VOCAB - 1), st.sampled_from([-1, VOCAB, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63),
                                                                 10**30, 1.0, "1", None]), 4)


def maybe_hostile(valid: st.SearchStrategy, one_in: int = 4) -> st.SearchStrategy:
    return weighted(valid, HOSTILE, one_in)


def optional_fields(fields: dict[str, st.SearchStrategy], max_extra: int = 4) -> st.SearchStrategy:
    """A dict with a few of `fields` (each maybe hostile) and sometimes a key the server does not know."""
    names = sorted(fields)
    chosen = st.lists(st.sampled_from(names), unique=True, max_size=max_extra)
    unknown = st.dictionaries(st.sampled_from(["foo", "Temperature", "max-tokens", "\ud800", "", "n_", "__proto__"]),
                              HOSTILE, max_size=1)
    return st.tuples(chosen, weighted(st.just({}), unknown, 8)).flatmap(
        lambda pair: st.fixed_dictionaries({n: maybe_hostile(fields[n]) for n in pair[0]}).map(
            lambda d: {**pair[1], **d}))


# ---- grammars ----

SCHEMAS_FILE = Path(__file__).resolve().parents[1] / "data" / "json_schemas.json"
#: Schemas a grammar engine may compile but not follow: only self-references, contradictions, empty enums.
HOSTILE_SCHEMAS = [
    {"$ref": "#"},
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    {"anyOf": [{"$ref": "#"}]},
    {"type": "integer", "minimum": 5, "maximum": 1},
    {"enum": []},
    {"not": {}},
    {"type": "string", "pattern": "("},
    {"type": "string", "minLength": 10, "maxLength": 2},
    {"type": "object", "required": ["a"], "additionalProperties": False},
    {"$ref": "#/definitions/missing"},
    {"type": "nonsense"},
    {"enum": ["x"]},
    {"const": 7},
    {"type": "boolean"},
    {"type": "string", "maxLength": 3},
]


def _stored_schemas() -> list[Any]:
    try:
        return list(json.loads(SCHEMAS_FILE.read_text()).values())
    except (OSError, ValueError):
        return []


SCHEMA = st.one_of(st.sampled_from(HOSTILE_SCHEMAS), st.sampled_from(_stored_schemas() or [{"type": "object"}]),
                   st.just(True), st.just(False), HOSTILE)
REGEX = st.sampled_from(["[0-9]{2}", "(yes|no)", "a+", "(", "[a-", "\\", "x{99999999}", "", "\\p{Foo}", ".*",
                         "\ud800"])
TGI_GRAMMAR = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["json", "json_object"]), "value": SCHEMA}),
    st.fixed_dictionaries({"type": st.just("regex"), "value": REGEX}),
    st.fixed_dictionaries({"type": maybe_hostile(st.sampled_from(["json", "regex", "grammar", "xml"])),
                           "value": HOSTILE}),
)
RESPONSE_FORMAT = st.one_of(
    st.just({"type": "json_object"}), st.just({"type": "text"}),
    st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
        {"name": st.just("x"), "schema": SCHEMA}, optional={"strict": st.booleans()})}),
    st.fixed_dictionaries({"type": st.just("json"), "value": SCHEMA}),  # TGI's own form
    st.fixed_dictionaries({"type": HOSTILE}, optional={"json_schema": HOSTILE, "value": HOSTILE}),
)

# ---- TGI ----

TGI_PARAMETERS = {
    "best_of": st.sampled_from([1, 2]),
    "decoder_input_details": st.booleans(),
    "details": st.booleans(),
    "do_sample": st.booleans(),
    "frequency_penalty": st.floats(-2, 2),
    "grammar": TGI_GRAMMAR,
    "repetition_penalty": st.floats(0.5, 2),
    "return_full_text": st.booleans(),
    "seed": st.integers(0, 2**64 - 1),
    "stop": st.lists(SMALL_TEXT, max_size=4),
    "temperature": st.floats(0.01, 5),
    "top_k": st.integers(1, 100),
    "top_n_tokens": st.integers(0, 5),
    "top_p": st.floats(0.01, 0.99),
    "typical_p": st.floats(0.01, 0.99),
    "truncate": st.integers(1, 100),
    "watermark": st.booleans(),
    "adapter_id": st.sampled_from(["", "none"]),
    "min_new_tokens": st.integers(0, 2),
}


@st.composite
def tgi_case(draw, routes=("/generate", "/generate_stream", "/")) -> HttpCase:
    """A TGI generate request (`POST /` takes `stream` too)."""
    route = draw(st.sampled_from(routes))
    params = draw(optional_fields(TGI_PARAMETERS, max_extra=5))
    params["max_new_tokens"] = draw(BUDGET)
    body: dict[str, Any] = {"inputs": draw(maybe_hostile(TEXT, 8)),
                            "parameters": draw(weighted(st.just(params), HOSTILE, 12))}
    if route == "/" and draw(st.booleans()):
        body["stream"] = draw(maybe_hostile(st.booleans()))
    if draw(st.integers(0, 15)) == 0:
        del body["inputs"]
    return HttpCase(route, body, draw(weighted(st.just(True), st.just(False), 8)))


@st.composite
def tokenize_case(draw) -> HttpCase:
    body = {"inputs": draw(weighted(SMALL_TEXT, HUGE_TEXT, 3))}
    if draw(st.booleans()):
        body["add_special_tokens"] = draw(maybe_hostile(st.booleans()))
    return HttpCase("/tokenize", body, draw(weighted(st.just(True), st.just(False), 8)))


# ---- OpenAI ----

SAMPLING = {
    "model": st.sampled_from(["tgi", "SmolLM2", ""]),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "seed": st.integers(0, 2**63 - 1),
    "stop": st.one_of(SMALL_TEXT, st.lists(SMALL_TEXT, max_size=4)),
    "frequency_penalty": st.floats(-2, 2),
    "presence_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.5, 2),
    "n": st.sampled_from([1, 2]),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "user": SMALL_TEXT,
    "logit_bias": st.dictionaries(st.sampled_from(["1", "50", "-1", "99999999999"]), st.floats(-100, 100),
                                  max_size=2),
}
CONTENT = st.one_of(
    TEXT, st.none(),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": SMALL_TEXT}), max_size=2),
    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_audio", "tool"]),
                                    "image_url": st.fixed_dictionaries({"url": SMALL_TEXT})}), max_size=1),
)
MESSAGE = st.fixed_dictionaries(
    {"role": maybe_hostile(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), 8),
     "content": maybe_hostile(CONTENT, 8)},
    optional={"name": SMALL_TEXT, "tool_call_id": SMALL_TEXT,
              "tool_calls": st.lists(st.fixed_dictionaries({"id": st.just("c1"), "type": st.just("function"),
                                                            "function": st.fixed_dictionaries({
                                                                "name": SMALL_TEXT, "arguments": SMALL_TEXT})}),
                                     max_size=1)})
TOOL = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": maybe_hostile(st.sampled_from(["get_weather", "f", "a-b"]), 6)},
    optional={"description": SMALL_TEXT, "parameters": SCHEMA})})
TOOL_CHOICE = st.one_of(st.sampled_from(["auto", "none", "required", "any", ""]),
                        st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
                            {"name": st.sampled_from(["get_weather", "missing"])})}))
CHAT = SAMPLING | {
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 5),
    "tools": st.lists(maybe_hostile(TOOL, 8), max_size=2),
    "tool_choice": TOOL_CHOICE,
    "tool_prompt": SMALL_TEXT,
    "response_format": RESPONSE_FORMAT,
    "stream": st.booleans(),
    "max_completion_tokens": BUDGET,
}
PROMPT = st.one_of(TEXT, st.lists(SMALL_TEXT, min_size=1, max_size=2), st.lists(TOKEN_ID, max_size=6),
                   st.lists(st.lists(TOKEN_ID, min_size=1, max_size=4), min_size=1, max_size=2))
COMPLETIONS = SAMPLING | {
    "echo": st.booleans(),
    "logprobs": st.integers(0, 5),
    "suffix": SMALL_TEXT,
    "best_of": st.sampled_from([1, 2, 3]),
    "stream": st.booleans(),
}


@st.composite
def chat_case(draw) -> HttpCase:
    body = draw(optional_fields(CHAT, max_extra=5))
    body["max_tokens"] = draw(BUDGET)
    if draw(st.integers(0, 15)):
        body["messages"] = draw(maybe_hostile(st.lists(MESSAGE, min_size=1, max_size=3), 10))
    return HttpCase("/v1/chat/completions", body, draw(weighted(st.just(True), st.just(False), 8)))


@st.composite
def completion_case(draw) -> HttpCase:
    body = draw(optional_fields(COMPLETIONS, max_extra=5))
    body["max_tokens"] = draw(BUDGET)
    if draw(st.integers(0, 15)):
        body["prompt"] = draw(maybe_hostile(PROMPT, 8))
    return HttpCase("/v1/completions", body, draw(weighted(st.just(True), st.just(False), 8)))


# ---- Triton HTTP generate extension ----

TRITON_FIELDS = {
    "stream": st.booleans(),
    "temperature": st.floats(0.01, 3),
    "top_p": st.floats(0.01, 0.99),
    "top_k": st.integers(1, 50),
    "seed": st.integers(0, 2**64 - 1),
    "stop": st.lists(SMALL_TEXT, max_size=3),
    "repetition_penalty": st.floats(0.5, 2),
    "exclude_input_in_output": st.booleans(),
    "return_full_text": st.booleans(),
    "ignore_eos": st.booleans(),
    "details": st.booleans(),
    "top_n_tokens": st.integers(0, 3),
    "do_sample": st.booleans(),
    "return_num_input_tokens": st.booleans(),
    "guided_decoding_guide_type": st.sampled_from(["json", "regex", "json_schema", "none", ""]),
    "guided_decoding_guide": st.one_of(SCHEMA.map(lambda s: json.dumps(s, default=str)), REGEX),
    "sampling_parameters": st.fixed_dictionaries({}, optional={"temperature": st.floats(0, 2), "top_k": st.integers(
        -1, 10), "max_tokens": BUDGET, "seed": HUGE_INTS}).map(lambda d: encode_json(d).decode()),
    "min_tokens": st.integers(0, 2),
    "parameters": st.dictionaries(st.sampled_from(["temperature", "max_tokens", "x"]), HOSTILE, max_size=2),
    "grammar": TGI_GRAMMAR,
}


@st.composite
def triton_generate_case(draw) -> HttpCase:
    route = draw(st.sampled_from(["/v2/models/tgi_llm/generate", "/v2/models/tgi_llm/generate_stream"]))
    body = draw(optional_fields(TRITON_FIELDS, max_extra=5))
    for name in draw(st.lists(st.sampled_from(["max_tokens", "max_new_tokens"]), min_size=1, max_size=2, unique=True)):
        body[name] = draw(BUDGET)
    if draw(st.integers(0, 7)):
        body["text_input"] = draw(maybe_hostile(TEXT, 8))
    else:
        body["input_ids"] = draw(maybe_hostile(st.lists(TOKEN_ID, min_size=1, max_size=6), 6))
    return HttpCase(route, body, draw(weighted(st.just(True), st.just(False), 8)))


DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES", "BF16"]


@st.composite
def triton_infer_case(draw) -> HttpCase:
    """Triton's /infer (refused: the model is decoupled), with tensors shaped as hostile as can be."""
    tensor = st.fixed_dictionaries(
        {"name": maybe_hostile(st.sampled_from(["text_input", "input_ids", "max_tokens", "temperature"]), 6),
         "datatype": maybe_hostile(st.sampled_from(DATATYPES), 6),
         "shape": maybe_hostile(st.lists(st.integers(-2, 3), max_size=3), 6),
         "data": maybe_hostile(st.lists(st.one_of(SMALL_TEXT, st.integers(-5, 5), st.floats()), max_size=3), 6)})
    body = {"inputs": draw(maybe_hostile(st.lists(tensor, max_size=3), 6))}
    if draw(st.booleans()):
        body["parameters"] = draw(HOSTILE)
    return HttpCase("/v2/models/tgi_llm/infer", body)


# ---- gRPC ModelStreamInfer ----


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    #: Typed values for InferTensorContents (BYTES: bytes elements), or raw bytes for raw_input_contents.
    values: list[Any] = field(default_factory=list)
    raw: bytes | None = None


@dataclass
class GrpcCase:
    tensors: list[Tensor]
    parameters: dict[str, Any] = field(default_factory=dict)
    #: Send every tensor in raw_input_contents (as tritonclient does) rather than typed contents.
    use_raw: bool = True
    #: Open the stream with the `triton_grpc_error` header: errors end it with a status, not an in-stream error.
    status_header: bool = True
    request_id: str = "fuzz"

    def names(self) -> set[str]:
        return {t.name for t in self.tensors} | set(self.parameters)


NUMPY = {"BOOL": "?", "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q", "INT8": "b", "INT16": "h",
         "INT32": "i", "INT64": "q", "FP16": "e", "FP32": "f", "FP64": "d"}


def raw_bytes(datatype: str, values: list[Any]) -> bytes:
    """raw_input_contents as Triton reads them: little-endian elements; BYTES: 4-byte length + bytes each.
    Values that do not fit the type are written at the type's width anyway (wrapped), as a careless client
    would."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in values)
    code = NUMPY.get(datatype)
    if code is None:
        return b"\x00" * 2 * len(values)
    out = b""
    for v in values:
        if code in "efd":
            out += struct.pack("<" + code, float(v))
        elif code == "?":
            out += struct.pack("<B", int(bool(v)))
        else:
            bits = struct.calcsize(code) * 8
            out += (int(v) % (1 << bits)).to_bytes(bits // 8, "little")
    return out


BYTES_VALUE = st.one_of(
    SMALL_TEXT.map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"\xff\xfe", b"\xed\xa0\x80", b"\xc3", b"\x00", b"caf\xe9", b"{\"max_tokens\": NaN}"]),
    st.binary(max_size=8),
)
FLOAT_VALUE = st.one_of(st.floats(0.01, 2), st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e38, 3e38]))
#: Inputs the model declares (model_repository/tgi_llm/config.pbtxt) and their types.
DECLARED = {
    "temperature": "FP32", "top_p": "FP32", "typical_p": "FP32", "repetition_penalty": "FP32",
    "frequency_penalty": "FP32", "presence_penalty": "FP32", "top_k": "INT32", "seed": "UINT64",
    "do_sample": "BOOL", "details": "BOOL", "top_n_tokens": "INT32", "truncate": "INT32",
    "decoder_input_details": "BOOL", "return_full_text": "BOOL", "ignore_eos": "BOOL", "min_tokens": "INT32",
    "min_length": "INT32", "exclude_input_in_output": "BOOL", "return_num_input_tokens": "BOOL",
    "return_num_output_tokens": "BOOL", "stop": "BYTES", "sampling_parameters": "BYTES",
    "guided_decoding_guide_type": "BYTES", "guided_decoding_guide": "BYTES", "lora_name": "BYTES",
}


def values_for(datatype: str) -> st.SearchStrategy:
    if datatype == "BYTES":
        return BYTES_VALUE
    if datatype in ("FP16", "FP32", "FP64", "BF16"):
        return FLOAT_VALUE
    if datatype == "BOOL":
        return st.booleans()
    return st.one_of(st.integers(0, 4), HUGE_INTS)


@st.composite
def tensor(draw, name: str, datatype: str, values: st.SearchStrategy | None = None, hostile: bool = True) -> Tensor:
    """One tensor; with `hostile`, sometimes another datatype, a shape that does not match the values, or raw
    bytes that are not whole elements."""
    if hostile and draw(st.integers(0, 5)) == 0:
        datatype, values = draw(st.sampled_from(DATATYPES)), None  # values of the type it now claims
    one = st.lists(values if values is not None else values_for(datatype), min_size=1, max_size=1)
    vals = draw(weighted(one, st.lists(values_for(datatype), max_size=3), 5) if hostile else one)
    shape = [len(vals)]
    if hostile and draw(st.integers(0, 5)) == 0:
        shape = draw(st.sampled_from([[], [1, 1], [2], [0], [-1], [2**31], [1, len(vals)], [2**62, 2**62]]))
    raw = raw_bytes(datatype, vals)
    if hostile and draw(st.integers(0, 9)) == 0:
        raw = draw(st.sampled_from([raw[:-1], raw + b"\x00", b"", b"\xff\xff\xff\x7f", raw * 2]))
    return Tensor(name, datatype, shape, vals, raw)


@st.composite
def grpc_case(draw, hostile: bool = True) -> GrpcCase:
    """A ModelStreamInfer request: text_input or input_ids, a 1-4 (or refused) max_tokens, stream on or off,
    plus some of the other declared inputs and request parameters, each possibly hostile."""
    tensors: list[Tensor] = []
    if draw(st.integers(0, 3)):
        tensors.append(draw(tensor("text_input", "BYTES", weighted(
            SMALL_TEXT.map(lambda s: s.encode("utf-8", "surrogatepass")), BYTES_VALUE, 3), hostile)))
    if not tensors or draw(st.integers(0, 4)) == 0:
        ids = weighted(st.integers(0, VOCAB - 1), HUGE_INTS, 4)
        kind = draw(st.sampled_from(["INT64", "INT32"]))
        length = draw(st.integers(1, 6))
        vals = draw(st.lists(ids, min_size=length, max_size=length))
        tensors.append(Tensor("input_ids", kind, [len(vals)], vals, raw_bytes(kind, vals)))
    budget = draw(weighted(st.integers(1, 4), st.sampled_from([0, -1, 513, 2**31 - 1]), 5))
    tensors.append(Tensor("max_tokens", "INT32", [1], [budget], raw_bytes("INT32", [budget])))
    if draw(st.booleans()):
        tensors.append(Tensor("stream", "BOOL", [1], [True], b"\x01"))
    if hostile:
        for name in draw(st.lists(st.sampled_from(sorted(DECLARED)), unique=True, max_size=3)):
            values = None
            if name == "sampling_parameters":
                values = st.fixed_dictionaries({}, optional={"temperature": st.floats(0, 2), "max_tokens": BUDGET,
                                                             "top_p": NON_FINITE}).map(encode_json)
            if name in ("min_tokens", "min_length"):
                values = st.integers(-1, 2)
            tensors.append(draw(tensor(name, DECLARED[name], values)))
        if draw(st.integers(0, 7)) == 0:  # an input the model does not declare
            tensors.append(draw(tensor(draw(st.sampled_from(["foo", "", "text_input ", "\u00e9", "max_tokens"])),
                                       draw(st.sampled_from(DATATYPES)))))
    parameters = draw(st.dictionaries(
        st.sampled_from(["temperature", "top_p", "seed", "stop", "grammar", "best_of", "x"]),
        st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(), SMALL_TEXT),
        max_size=2)) if hostile else {}
    return GrpcCase(tensors, parameters, use_raw=draw(st.booleans()) if hostile else True,
                    status_header=draw(st.booleans()))
