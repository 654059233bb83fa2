"""Engine events -> output tensors (as numpy arrays by name), named as Triton's vLLM/TRT-LLM models do.

`text_output` is the text delta of a step's tokens when streaming (one token, or several a step accepted
by speculation: the responder sends what one step made for a request as one response, as Triton's vLLM
and TensorRT-LLM backends do) and the whole text otherwise; the final response also carries
`finish_reason` and the token counts. Token ids, logprobs and top
tokens (TGI's `details`) are sent only when the request asked for them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tgi_llm.events import FinalEvent, PrefillToken, Token, TokenEvent

Outputs = dict[str, np.ndarray]

TEXT = "text_output"
FINISH_REASON = "finish_reason"
NUM_INPUT = "num_input_tokens"
NUM_OUTPUT = "num_output_tokens"
NUM_CACHED = "num_cached_tokens"  # prompt tokens whose K/V came from the prefix cache
NUM_ACCEPTED = "num_accepted_draft_tokens"  # generated tokens speculation guessed right (no step of their own)
SEED = "seed"
TOKEN_IDS = "token_ids"
TOKEN_TEXTS = "token_texts"
TOKEN_LOGPROBS = "token_logprobs"
TOKEN_SPECIAL = "token_special"
#: The id of a top-token padding entry (see _top_tokens).
PAD_ID = -1
TOP_IDS = "top_token_ids"
TOP_TEXTS = "top_token_texts"
TOP_LOGPROBS = "top_token_logprobs"
PREFILL_IDS = "prefill_token_ids"
PREFILL_TEXTS = "prefill_token_texts"
PREFILL_LOGPROBS = "prefill_token_logprobs"  # of prompt tokens 1..n-1 (the first has none)
PREFILL_TOP_IDS = "prefill_top_token_ids"  # [n-1, top_n_tokens], aligned with prefill_token_logprobs
PREFILL_TOP_TEXTS = "prefill_top_token_texts"
PREFILL_TOP_LOGPROBS = "prefill_top_token_logprobs"


def _strings(values: Sequence[str]) -> np.ndarray:
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def _tokens(tokens: Sequence[Token]) -> Outputs:
    return {
        TOKEN_IDS: np.array([t.id for t in tokens], dtype=np.int64),
        TOKEN_TEXTS: _strings([t.text for t in tokens]),
        TOKEN_LOGPROBS: np.array([t.logprob for t in tokens], dtype=np.float32),
        TOKEN_SPECIAL: np.array([t.special for t in tokens], dtype=np.bool_),
    }


def _top_tokens(rows: Sequence[Sequence[Token]], names: tuple[str, str, str] = (TOP_IDS, TOP_TEXTS, TOP_LOGPROBS)
                ) -> Outputs:
    """[tokens, n] arrays; rows are as wide as the widest one. A step whose sampler ruled out some of the
    top_n_tokens alternatives (top_k, a grammar) has fewer: its row is padded with id -1, empty text and the
    lowest float32 as logprob (a JSON number, unlike NaN or -inf)."""
    width = max((len(r) for r in rows), default=0)
    if not rows or width == 0:
        return {}
    ids = np.full((len(rows), width), PAD_ID, dtype=np.int64)
    lps = np.full((len(rows), width), np.finfo(np.float32).min, dtype=np.float32)
    texts = np.full((len(rows), width), b"", dtype=np.object_)
    for r, row in enumerate(rows):
        for c, t in enumerate(row):
            ids[r, c], lps[r, c], texts[r, c] = t.id, t.logprob, t.text.encode("utf-8")
    return dict(zip(names, (ids, texts, lps), strict=True))


def _prefill(tokens: Sequence[PrefillToken]) -> Outputs:
    return {
        PREFILL_IDS: np.array([t.id for t in tokens], dtype=np.int64),
        PREFILL_TEXTS: _strings([t.text for t in tokens]),
        # From the second token on: the first has none, and a NaN would make the generate extension's JSON
        # invalid (it writes a bare NaN).
        PREFILL_LOGPROBS: np.array([t.logprob for t in tokens[1:]], dtype=np.float32),
    } | _top_tokens([t.top for t in tokens[1:]], (PREFILL_TOP_IDS, PREFILL_TOP_TEXTS, PREFILL_TOP_LOGPROBS))


def token_outputs(events: Sequence[TokenEvent], prefix: str = "", details: bool = False) -> Outputs:
    """Streamed tokens, in order: their text deltas as one (after `prefix`, the prompt when
    return_full_text), the count of tokens generated so far and, with details, one entry per token."""
    out: Outputs = {TEXT: _strings([prefix + "".join(e.token.text for e in events)])}
    if events:  # tokens generated so far: a client learns how many this response carries
        out[NUM_OUTPUT] = np.array([events[-1].index + 1], dtype=np.uint32)
    if details:
        out |= _tokens([e.token for e in events])
        if any(e.top_tokens for e in events):
            out |= _top_tokens([e.top_tokens for e in events])
    return out


def final_outputs(final: FinalEvent, stream: bool, details: bool, last: Sequence[TokenEvent] = (),
                  prefix: str = "") -> Outputs:
    """The last response of a request that finished.

    Streaming: `last` are its tokens not sent yet (the last step's, sent in this same response).
    Not streaming: the whole text and every token.
    """
    if stream:
        out = token_outputs(last, prefix, details)
    else:
        out = {TEXT: _strings([final.generated_text])}
        if details:
            out |= _tokens(final.tokens) | _top_tokens(final.top_tokens)
            if final.prefill:
                out |= _prefill(final.prefill)
    out[FINISH_REASON] = _strings([final.finish_reason.value])
    out[NUM_INPUT] = np.array([final.input_tokens], dtype=np.uint32)
    out[NUM_OUTPUT] = np.array([final.generated_tokens], dtype=np.uint32)
    out[NUM_CACHED] = np.array([final.cached_tokens], dtype=np.uint32)
    out[NUM_ACCEPTED] = np.array([final.accepted_draft_tokens], dtype=np.uint32)
    if details and final.seed is not None:
        out[SEED] = np.array([final.seed], dtype=np.uint64)
    return out
