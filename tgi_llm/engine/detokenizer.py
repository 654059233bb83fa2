"""Incremental detokenization for streaming (TGI's decode_token with prefix/read offsets).

Each step decodes a short window `ids[prefix_offset:]` and emits what it adds over
`ids[prefix_offset:read_offset]`, so the cost per token does not grow with the output.
Text is held back while the window ends in U+FFFD (a UTF-8 character split across
byte tokens) and flushed by `finish()`.

Why the deltas add up exactly: read_offset only moves to a point where the decoded
text ends in a complete character, i.e. a UTF-8 synchronisation point of the byte
stream. Decoding is then additive there, decode(a + b) == decode(a) + decode(b), so
every delta is exactly the decode of the tokens after the previous read_offset, and
`finish()` emits the rest. For byte-level BPE tokenizers (SmolLM2, Llama 3, Qwen, GPT-2)
the deltas therefore concatenate to `tokenizer.decode(generated_ids)`. Decoders that
strip the first token's leading space (SentencePiece Metaspace) keep it here, as TGI's
stream and generated_text do: the last prompt tokens seed the window for that reason.
Transformers' clean_up_tokenization_spaces is never applied (it is not prefix-stable).

Special tokens that decoding skips never enter the window: they add no text, and kept there a run of them
(an ignore_eos answer past its end-of-sequence) would make every step decode the whole run again.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import tokenizers

_REPLACEMENT = "\ufffd"
#: Per Rust tokenizer: the ids its decode(skip_special_tokens=True) drops (~30 us to list: once, not per request).
_SKIPPED: weakref.WeakKeyDictionary[tokenizers.Tokenizer, frozenset[int]] = weakref.WeakKeyDictionary()


def _backend(tokenizer) -> tokenizers.Tokenizer | None:
    if isinstance(tokenizer, tokenizers.Tokenizer):
        return tokenizer
    return getattr(tokenizer, "backend_tokenizer", None)


def _decoder(tokenizer, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    # The Rust tokenizer directly: faster than transformers' decode and never cleans up spaces.
    backend = _backend(tokenizer)
    if backend is not None:
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(
        ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
    )


def _skipped_ids(tokenizer) -> frozenset[int]:
    """The ids decoding drops with skip_special_tokens: the Rust tokenizer's special added tokens (it filters
    those before its decoder runs), else what a slow transformers tokenizer filters (all_special_ids)."""
    backend = _backend(tokenizer)
    if backend is None:
        return frozenset(getattr(tokenizer, "all_special_ids", ()))
    skipped = _SKIPPED.get(backend)
    if skipped is None:
        added = backend.get_added_tokens_decoder()
        skipped = _SKIPPED[backend] = frozenset(i for i, token in added.items() if token.special)
    return skipped


class IncrementalDetokenizer:
    """Per request. `step(token_id)` returns the text delta that token adds; this delta is
    what `Token.text` carries (not the token's standalone text, as TGI sends): clients
    concatenate deltas. `finish()` returns any held-back text; call it once at the end."""

    def __init__(
        self,
        tokenizer,
        prompt_ids: Sequence[int],
        skip_special_tokens: bool = True,
        context_tokens: int = 5,
    ):
        self._decode = _decoder(tokenizer, skip_special_tokens)
        self._skipped = _skipped_ids(tokenizer) if skip_special_tokens else frozenset()
        seed = list(prompt_ids[max(len(prompt_ids) - context_tokens, 0) :]) if context_tokens > 0 else []
        # The seed must end on a complete character, or the first delta would be cut wrongly.
        if seed and self._decode(seed).endswith(_REPLACEMENT):
            seed = []
        self._ids: list[int] = seed  # the window's tokens from ids[prefix_offset]: skipped ones left out
        self._generated: list[int] = []
        self._prefix_offset = 0
        self._read_offset = len(seed)
        self._prefix_len: int | None = None  # len(decode(ids[prefix_offset:read_offset])), cached
        self._parts: list[str] = []

    @property
    def generated_ids(self) -> list[int]:
        return list(self._generated)

    @property
    def text(self) -> str:
        """Everything emitted so far (after `finish()`: the whole generated text)."""
        return "".join(self._parts)

    def step(self, token_id: int) -> str:
        self._generated.append(token_id)
        if token_id in self._skipped:
            return ""  # decoding drops it wherever it stands: the text is as if it were not there
        self._ids.append(token_id)
        window = self._decode(self._ids[self._prefix_offset :])
        prefix_len = self._prefix_length()
        if len(window) > prefix_len and not window.endswith(_REPLACEMENT):
            return self._emit(window[prefix_len:])
        return ""

    def finish(self) -> str:
        if self._read_offset == len(self._ids):
            return ""
        window = self._decode(self._ids[self._prefix_offset :])
        return self._emit(window[self._prefix_length() :])

    def _prefix_length(self) -> int:
        if self._prefix_len is None:
            self._prefix_len = len(self._decode(self._ids[self._prefix_offset : self._read_offset]))
        return self._prefix_len

    def _emit(self, delta: str) -> str:
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._prefix_len = None
        self._parts.append(delta)
        return delta
