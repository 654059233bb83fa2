"""Request validation with TGI's rules and wording: one message per rule, naming field and limit."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from tgi_llm.engine.grammar import GrammarCompiler, GrammarSpec
from tgi_llm.engine.limits import Limits
from tgi_llm.errors import ValidationError
from tgi_llm.lora.registry import Adapter, LoraRegistry
from tgi_llm.request import SamplingParams, StoppingParams, ValidRequest

_U64_MAX = 2**64 - 1
#: The smallest temperature and repetition penalty used: the sampler divides logits by them, and a float32
#: logit over a tinier positive number (1e-38) is infinite, so the distribution became NaN. Below this both
#: already act at their limit (greedy; every seen token first).
_MIN_DIVISOR = 1e-5


def _number(params: Mapping[str, Any], name: str) -> float | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(f"`{name}` must be a number. Given: {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        number = math.inf
    if not math.isfinite(number):  # NaN passes every comparison: it would sample token 0 forever
        raise ValidationError(f"`{name}` must be a finite number. Given: {value!r}")
    return number


def _integer(params: Mapping[str, Any], name: str) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"`{name}` must be an integer. Given: {value!r}")
    return value


def _flag(params: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValidationError(f"`{name}` must be a boolean. Given: {value!r}")
    return value


def _stop_sequences(params: Mapping[str, Any], limit: int) -> tuple[str, ...]:
    stop = params.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, (list, tuple)) and len(stop) > limit:  # counted before any element is looked at
        raise ValidationError(f"`stop` supports up to {limit} stop sequences. Given: {len(stop)}")
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise ValidationError(f"`stop` must be a list of strings. Given: {stop!r}")
    return tuple(s for s in stop if s)


#: With `truncate`, tokens kept beyond it when only the prompt's end is tokenized (see _cut_for_truncate).
_TRUNCATE_MARGIN_TOKENS = 16


def too_long(name: str, chars: int, limit: int, max_token_chars: int, what: str = "characters") -> str | None:
    """Why a text of `chars` characters is refused before it is tokenized (None: it may fit): more characters
    than `limit` tokens of at most `max_token_chars` characters each can hold."""
    if chars <= limit * max_token_chars:
        return None
    return (f"`{name}` must have less than {limit} tokens. Given: {chars} {what}, more than {limit} tokens of at "
            f"most {max_token_chars} characters each can hold")


def longest_token_chars(tokenizer: Any) -> int | None:
    """An upper bound on the characters one token covers: the longest vocabulary entry (byte-level BPE
    spells each byte as one character, SentencePiece a space as one), so a prompt of n characters has at
    least n / this many tokens. None when the tokenizer does not expose its vocabulary."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:
        return None
    return max((len(token) for token in vocab), default=0) or None


class Validator:
    """Turns (inputs, TGI parameters) into a ValidRequest or raises ValidationError."""

    def __init__(self, tokenizer: Any, limits: Limits, grammars: GrammarCompiler | None = None,
                 lora: LoraRegistry | None = None, base_names: frozenset[str] = frozenset()) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.grammars = grammars  # None: requests with a grammar are rejected
        self.lora = lora  # None: the server takes no LoRA adapters
        #: `adapter_id` values that mean the base model: the model's id (TGI's own), or empty.
        self.base_names = base_names | {""}
        self.max_token_chars = longest_token_chars(tokenizer)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def validate(
        self, inputs: str | Sequence[int], params: Mapping[str, Any] | None = None, stream: bool = False
    ) -> ValidRequest:
        params = dict(params or {})
        lim = self.limits
        sampling = self._sampling(params)
        best_of = _integer(params, "best_of")
        if best_of is not None and best_of != 1:
            if best_of <= 0 or best_of > lim.max_best_of:
                raise ValidationError(f"`best_of` must be > 0 and <= {lim.max_best_of}. Given: {best_of}")
            raise ValidationError("`best_of` != 1 is not allowed for this endpoint")
        top_n_tokens = _integer(params, "top_n_tokens") or 0
        if top_n_tokens < 0 or top_n_tokens > lim.max_top_n_tokens:
            raise ValidationError(
                f"`top_n_tokens` must be >= 0 and <= {lim.max_top_n_tokens}. Given: {top_n_tokens}"
            )
        speculate = _integer(params, "speculate")
        if speculate is not None and not 0 <= speculate <= lim.speculate:
            raise ValidationError(
                f"`speculate` must be >= 0 and <= {lim.speculate} (the server's --speculate). Given: {speculate}"
            )
        decoder_input_details = _flag(params, "decoder_input_details")
        if decoder_input_details and (stream or _flag(params, "stream")):
            raise ValidationError("`decoder_input_details` == true is not supported when streaming tokens")
        adapter = self._adapter(params.get("adapter_id"))
        grammar = None
        if params.get("grammar") is not None:
            if self.grammars is None:
                raise ValidationError("grammar is not supported")
            grammar = self.grammars.compile(GrammarSpec.parse(params["grammar"]))
        stop = _stop_sequences(params, lim.max_stop_sequences)
        max_new_tokens = _integer(params, "max_new_tokens")
        if max_new_tokens is not None and max_new_tokens <= 0:
            raise ValidationError("`max_new_tokens` must be strictly positive")
        truncate = _integer(params, "truncate")
        if truncate is not None and (truncate <= 0 or truncate > lim.max_input_tokens):
            raise ValidationError(
                f"`truncate` must be strictly positive and less than {lim.max_input_tokens}. Given: {truncate}"
            )

        input_text, input_ids = self._input_ids(self._bounded(inputs, truncate))
        if isinstance(inputs, str):
            input_text = inputs  # the whole prompt, for return_full_text, even if only its end was tokenized
        if truncate is not None and len(input_ids) > truncate:
            input_ids = input_ids[-truncate:]  # TGI truncates from the left: the end of a prompt matters most
        input_length = len(input_ids)
        if input_length > lim.max_input_tokens:
            raise ValidationError(
                f"`inputs` must have less than {lim.max_input_tokens} tokens. Given: {input_length}"
            )
        if max_new_tokens is None:
            max_new_tokens = lim.max_total_tokens - input_length  # "up to the limit", as TGI v3
        min_new_tokens = _integer(params, "min_new_tokens") or 0
        if not 0 <= min_new_tokens <= max_new_tokens:
            raise ValidationError(
                f"`min_new_tokens` must be >= 0 and <= `max_new_tokens` ({max_new_tokens}). Given: {min_new_tokens}"
            )
        if input_length + max_new_tokens > lim.max_total_tokens:
            raise ValidationError(
                f"`inputs` tokens + `max_new_tokens` must be <= {lim.max_total_tokens}. "
                f"Given: {input_length} `inputs` tokens and {max_new_tokens} `max_new_tokens`"
            )
        return ValidRequest(
            input_ids=tuple(input_ids),
            sampling=sampling,
            stopping=StoppingParams(
                max_new_tokens=max_new_tokens, stop_sequences=stop, ignore_eos=_flag(params, "ignore_eos"),
                min_new_tokens=min_new_tokens,
            ),
            top_n_tokens=top_n_tokens,
            details=_flag(params, "details"),
            decoder_input_details=decoder_input_details,
            return_full_text=_flag(params, "return_full_text"),
            input_text=input_text,
            grammar=grammar,
            speculate=speculate,
            lora=adapter,
            cache_key=adapter.cache_key if adapter is not None else b"",
        )

    def _adapter(self, name: Any) -> Adapter | None:
        """The LoRA adapter `adapter_id` names (TGI's parameter; OpenAI's `model` and Triton's `lora_name` arrive
        as it), or None for the base model. An unknown name is an error, never the base model's answer."""
        if name is None or name in self.base_names:
            return None
        if not isinstance(name, str):
            raise ValidationError(f"`adapter_id` must be a string. Given: {name!r}")
        if self.lora is None:
            raise ValidationError(f"LoRA adapter {name!r} is not loaded: this server takes no adapters (start it "
                                  "with --lora-adapters or --lora-runtime-loading)")
        return self.lora.lookup(name)

    def _bounded(self, inputs: str | Sequence[int], truncate: int | None) -> str | Sequence[int]:
        """What to tokenize, decided from the prompt's length alone (a 50 MB prompt took 70 s to tokenize).

        Without `truncate`, a prompt longer than max_input_tokens tokens of the longest token can hold is
        refused. With it, only the prompt's last tokens are kept, so only its end is tokenized: enough
        characters for `truncate` tokens plus a margin. Those tokens are the whole prompt's unless the cut
        falls inside one unbroken run of text longer than the margin (a single pre-tokenizer word)."""
        if not isinstance(inputs, str) or self.max_token_chars is None:
            return inputs
        if truncate is not None:
            keep = (truncate + _TRUNCATE_MARGIN_TOKENS) * self.max_token_chars
            return inputs if len(inputs) <= keep else inputs[-keep:]
        limit = self.limits.max_input_tokens
        refusal = too_long("inputs", len(inputs), limit, self.max_token_chars)
        if refusal is not None:
            raise ValidationError(refusal)
        return inputs

    def _input_ids(self, inputs: str | Sequence[int]) -> tuple[str | None, list[int]]:
        if isinstance(inputs, str):
            if not inputs:
                raise ValidationError("`inputs` cannot be empty")
            return inputs, self.tokenize(inputs)
        ids = list(inputs)
        if not ids:
            raise ValidationError("`inputs` cannot be empty")
        vocab = len(self.tokenizer)
        for token_id in ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < vocab:
                raise ValidationError(f"`inputs` token ids must be integers in [0, {vocab}). Given: {token_id!r}")
        return None, ids

    def _sampling(self, params: Mapping[str, Any]) -> SamplingParams:
        temperature = _number(params, "temperature")
        if temperature is not None and temperature <= 0.0:
            raise ValidationError("`temperature` must be strictly positive")
        repetition_penalty = _number(params, "repetition_penalty")
        if repetition_penalty is not None and repetition_penalty <= 0.0:
            raise ValidationError("`repetition_penalty` must be strictly positive")
        frequency_penalty = _number(params, "frequency_penalty")
        if frequency_penalty is not None and not -2.0 <= frequency_penalty <= 2.0:
            raise ValidationError("`frequency_penalty` must be >= -2.0 and <= 2.0")
        presence_penalty = _number(params, "presence_penalty")
        if presence_penalty is not None and not -2.0 <= presence_penalty <= 2.0:
            raise ValidationError("`presence_penalty` must be >= -2.0 and <= 2.0")
        top_p = _number(params, "top_p")
        if top_p is not None and (top_p <= 0.0 or top_p > 1.0):
            raise ValidationError("`top_p` must be > 0.0 and < 1.0")
        typical_p = _number(params, "typical_p")
        if typical_p is not None and (typical_p <= 0.0 or typical_p > 1.0):
            raise ValidationError("`typical_p` must be > 0.0 and < 1.0")
        top_k = _integer(params, "top_k")
        if top_k is not None and top_k <= 0:
            raise ValidationError("`top_k` must be strictly positive")
        seed = _integer(params, "seed")
        if seed is not None and not 0 <= seed <= _U64_MAX:
            raise ValidationError(f"`seed` must be >= 0 and <= {_U64_MAX}. Given: {seed}")
        temperature = 1.0 if temperature is None else max(temperature, _MIN_DIVISOR)
        repetition_penalty = 1.0 if repetition_penalty is None else max(repetition_penalty, _MIN_DIVISOR)
        top_p = 1.0 if top_p is None else top_p
        typical_p = 1.0 if typical_p is None else typical_p
        top_k = top_k or 0
        # TGI samples as soon as any warper is set, even without do_sample.
        has_warpers = temperature != 1.0 or top_k != 0 or top_p < 1.0 or typical_p < 1.0
        return SamplingParams(
            do_sample=_flag(params, "do_sample") or has_warpers,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            typical_p=typical_p,
            repetition_penalty=repetition_penalty,
            frequency_penalty=0.0 if frequency_penalty is None else frequency_penalty,
            presence_penalty=0.0 if presence_penalty is None else presence_penalty,
            seed=random.getrandbits(64) if seed is None else seed,
        )

