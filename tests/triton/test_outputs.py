"""Events -> output tensors: deltas when streaming, the whole text otherwise, details when asked."""

from __future__ import annotations

import numpy as np

from tgi_llm.events import FinalEvent, FinishReason, PrefillToken, Token, TokenEvent
from tgi_llm.triton import outputs as out


def token(i: int, text: str) -> Token:
    return Token(id=i, text=text, logprob=-0.25 * i)


FINAL = FinalEvent(
    request_id=1, generated_text=" a b", finish_reason=FinishReason.LENGTH, generated_tokens=2, input_tokens=3,
    seed=42, token_ids=[10, 11], tokens=[token(10, " a"), token(11, " b")],
    top_tokens=[[token(10, " a"), token(12, " c")], [token(11, " b"), token(13, " d")]],
    prefill=[PrefillToken(1, "x", None), PrefillToken(2, "y", -1.5), PrefillToken(3, "z", -2.0)],
)


def strings(array: np.ndarray) -> list[str]:
    return [v.decode() for v in array.reshape(-1)]


def test_streamed_token_is_its_delta_only_unless_details():
    event = TokenEvent(1, 0, token(10, " a"))
    assert set(out.token_outputs([event])) == {out.TEXT, out.NUM_OUTPUT}
    assert out.token_outputs([event])[out.NUM_OUTPUT].tolist() == [1]  # generated so far
    assert strings(out.token_outputs([event], prefix="Q:")[out.TEXT]) == ["Q: a"]
    detailed = out.token_outputs([event], details=True)
    assert detailed[out.TOKEN_IDS].tolist() == [10]
    assert detailed[out.TOKEN_LOGPROBS].dtype == np.float32


def test_a_steps_several_tokens_are_one_delta_with_an_entry_per_token():
    events = [TokenEvent(1, 0, token(10, " a"), [token(10, " a")]), TokenEvent(1, 1, token(11, " b"))]
    assert strings(out.token_outputs(events)[out.TEXT]) == [" a b"]
    detailed = out.token_outputs(events, details=True)
    assert detailed[out.TOKEN_IDS].tolist() == [10, 11] and strings(detailed[out.TOKEN_TEXTS]) == [" a", " b"]
    assert detailed[out.TOP_IDS].tolist() == [[10], [out.PAD_ID]]  # a row per token, padded where none


def test_non_streaming_final_has_the_whole_text_and_counts():
    o = out.final_outputs(FINAL, stream=False, details=False)
    assert strings(o[out.TEXT]) == [" a b"]
    assert strings(o[out.FINISH_REASON]) == ["length"]
    assert o[out.NUM_INPUT].tolist() == [3] and o[out.NUM_OUTPUT].tolist() == [2]
    assert out.TOKEN_IDS not in o and out.SEED not in o


def test_non_streaming_details_shape_as_tgi():
    o = out.final_outputs(FINAL, stream=False, details=True)
    assert o[out.TOKEN_IDS].tolist() == [10, 11]
    assert strings(o[out.TOKEN_TEXTS]) == [" a", " b"]
    assert o[out.TOP_IDS].shape == (2, 2) and o[out.TOP_IDS].tolist() == [[10, 12], [11, 13]]
    assert o[out.PREFILL_IDS].tolist() == [1, 2, 3]
    assert o[out.PREFILL_LOGPROBS].tolist() == [-1.5, -2.0]  # tokens 2 and 3: the first has no logprob
    assert out.PREFILL_TOP_IDS not in o  # no top_n_tokens asked
    assert o[out.SEED].tolist() == [42]


def test_streaming_final_carries_the_last_token_delta_not_the_whole_text():
    last = TokenEvent(1, 1, token(11, " b"))
    o = out.final_outputs(FINAL, stream=True, details=False, last=[last])
    assert strings(o[out.TEXT]) == [" b"]
    assert strings(o[out.FINISH_REASON]) == ["length"]
    # When the last token already went out, the final response adds no text.
    assert strings(out.final_outputs(FINAL, stream=True, details=False)[out.TEXT]) == [""]
