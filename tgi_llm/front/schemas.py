"""Request and response shapes of TGI's router and of OpenAI's API (the fields TGI implements)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from tgi_llm.front.errors import FrontError

# ---------------------------------------------------------------- TGI


class GenerateParameters(BaseModel):
    """TGI's GenerateParameters. Unknown fields are ignored, as serde does for TGI."""

    model_config = ConfigDict(extra="ignore")

    best_of: int | None = None
    decoder_input_details: bool = False
    details: bool = False
    do_sample: bool = False
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    grammar: Any = None
    max_new_tokens: int | None = None
    repetition_penalty: float | None = None
    return_full_text: bool | None = None
    seed: int | None = None
    stop: list[str] | str | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_n_tokens: int | None = None
    top_p: float | None = None
    truncate: int | None = None
    typical_p: float | None = None
    watermark: bool = False
    adapter_id: str | None = None
    #: At most this many guessed tokens per step for this request (0..the server's --speculate).
    speculate: int | None = None

    def to_engine(self) -> dict[str, Any]:
        """The set parameters by TGI name, for the engine (which validates them with TGI's messages)."""
        out = self.model_dump(exclude_none=True)
        for flag in ("decoder_input_details", "details", "do_sample", "watermark"):
            if not out.get(flag):
                out.pop(flag, None)
        if isinstance(out.get("stop"), str):
            out["stop"] = [out["stop"]]
        return out


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    inputs: str
    parameters: GenerateParameters = Field(default_factory=GenerateParameters)


class CompatGenerateRequest(GenerateRequest):
    stream: bool = False


class Token(BaseModel):
    id: int
    text: str
    logprob: float | None
    special: bool = False


class PrefillToken(BaseModel):
    id: int
    text: str
    logprob: float | None


class BestOfSequence(BaseModel):
    generated_text: str
    finish_reason: str
    generated_tokens: int
    seed: int | None
    prefill: list[PrefillToken] = Field(default_factory=list)
    tokens: list[Token] = Field(default_factory=list)
    top_tokens: list[list[Token]] = Field(default_factory=list)


class Details(BaseModel):
    finish_reason: str
    generated_tokens: int
    seed: int | None
    #: Prompt tokens served from the prefix cache (not in TGI's schema; clients ignore unknown keys).
    cached_tokens: int = 0
    #: Generated tokens speculation guessed and the model confirmed (--speculate; not in TGI's schema).
    accepted_draft_tokens: int = 0
    prefill: list[PrefillToken] = Field(default_factory=list)
    tokens: list[Token] = Field(default_factory=list)
    top_tokens: list[list[Token]] | None = None  # TGI leaves it out when empty
    best_of_sequences: list[BestOfSequence] | None = None  # with best_of > 1: the other sequences


class GenerateResponse(BaseModel):
    generated_text: str
    details: Details | None = None

    def to_json(self) -> dict[str, Any]:
        # Not exclude_none: null logprobs (the first prefill token) and a null seed are part of TGI's shape.
        out = self.model_dump()
        if self.details is None:
            del out["details"]
            return out
        for key in ("top_tokens", "best_of_sequences"):
            if out["details"][key] is None:
                del out["details"][key]
        return out


class StreamDetails(BaseModel):
    finish_reason: str
    generated_tokens: int
    seed: int | None
    input_length: int
    cached_tokens: int = 0
    accepted_draft_tokens: int = 0


class StreamResponse(BaseModel):
    index: int
    token: Token
    top_tokens: list[Token] = Field(default_factory=list)
    generated_text: str | None = None
    details: StreamDetails | None = None


class SimpleToken(BaseModel):
    id: int
    text: str
    start: int
    stop: int


# ---------------------------------------------------------------- OpenAI


class StreamOptions(BaseModel):
    include_usage: bool = False


class ContentPart(BaseModel):
    """One part of a message's content: text parts reach the template, others (images...) are left out."""

    model_config = ConfigDict(extra="allow")

    type: str = "text"
    text: str = ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def for_template(self) -> dict[str, Any]:
        """Plain {role, content} with content parts joined: chat templates expect a string."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content if part.type == "text")
        calls = getattr(self, "tool_calls", None)
        if not content and isinstance(calls, list) and calls:
            content = _calls_as_text(calls)  # an earlier tool call, in the shape the model was asked for
        out: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name:
            out["name"] = self.name
        return out


def _calls_as_text(calls: list[Any]) -> str:
    import json

    parts = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except (TypeError, json.JSONDecodeError):
            arguments = fn.get("arguments")
        parts.append(json.dumps({"name": fn.get("name"), "arguments": arguments}, separators=(",", ":")))
    return "\n".join(parts)


class SamplingRequest(BaseModel):
    """The sampling fields OpenAI's chat and completions requests share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None  # TGI's extension
    # vLLM's extensions to OpenAI's fields, which its users send (the TGI route has them as parameters).
    top_k: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    speculate: int | None = None  # TGI's per-request override of --speculate
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    def max_new_tokens(self) -> int | None:
        return self.max_tokens

    def to_engine(self) -> dict[str, Any]:
        """TGI's mapping: temperature 0 means greedy, any other (or none) samples."""
        params: dict[str, Any] = {}
        if self.temperature == 0.0:
            params["do_sample"] = False
        else:
            params["do_sample"] = True
            if self.temperature is not None:
                params["temperature"] = self.temperature
        for name in ("top_p", "seed", "frequency_penalty", "presence_penalty", "repetition_penalty",
                     "ignore_eos", "speculate"):
            value = getattr(self, name)
            if value is not None:
                params[name] = value
        if (max_tokens := self.max_new_tokens()) is not None:
            params["max_new_tokens"] = max_tokens
        if self.top_k not in (None, 0, -1):  # vLLM's 0 and -1: every token, as leaving it out
            params["top_k"] = self.top_k
        if self.min_tokens:
            if self.min_tokens < 0 or (max_tokens is not None and self.min_tokens > max_tokens):
                raise FrontError(f"`min_tokens` must be >= 0 and <= `max_tokens` ({max_tokens}). "
                                 f"Given: {self.min_tokens}", "validation")
            params["min_new_tokens"] = self.min_tokens
        if self.stop:
            params["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return params


class ChatRequest(SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    tool_prompt: str | None = None  # TGI's: what precedes the tool descriptions in the prompt
    response_format: Any = None
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. Qwen3's and SmolLM3's `enable_thinking`

    def max_new_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    def to_engine(self) -> dict[str, Any]:
        params = super().to_engine()
        if self.logprobs:
            params["details"] = True
            if self.top_logprobs:
                params["top_n_tokens"] = self.top_logprobs
        return params


class CompletionRequest(SamplingRequest):
    #: Text, texts, token ids, or lists of token ids (lm-eval's tokenized requests). Strict: `true` or `1.0` is
    #: no token id.
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatLogprob]


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None  # a thinking model's <think> part (left out of the body when None)
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI's streamed pieces: index, id, type, function


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: Any = None
    finish_reason: str | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str
    root: str | None = None  # vLLM's: what the card serves (the model id)
    parent: str | None = None  # vLLM's: a LoRA adapter's base model


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
