"""TGI's stream events from Triton chunks: which token may be the last, and work per token bounded by its text."""

from __future__ import annotations

import random

from tgi_llm.front.protocol import Chunk, TokenInfo
from tgi_llm.front.schemas import GenerateParameters
from tgi_llm.front.tgi_stream import _Events


def _feed(state: _Events, text: str) -> bool:
    """One token's chunk; whether its event is held as maybe the last."""
    (response,) = state.tokens(Chunk(text=text, tokens=[TokenInfo(5, text, -0.1)]))
    return state.maybe_last(response)


def test_a_stop_sequence_is_seen_across_token_boundaries_and_inside_one_token():
    state = _Events(GenerateParameters(stop=["STOP", "xy"]), "")
    assert [_feed(state, t) for t in ("some ", "S", "TO")] == [False, False, False]
    assert _feed(state, "P more")  # completes "STOP" with text after it in the same token
    inside = _Events(GenerateParameters(stop="xy"), "")
    assert not _feed(inside, "ab") and _feed(inside, "axyb")


def test_holding_matches_a_search_of_the_whole_text_on_random_streams():
    rng = random.Random(0)
    for _ in range(300):
        stops = ["".join(rng.choices("ab", k=rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        state = _Events(GenerateParameters(stop=stops), "")
        text = ""
        for _ in range(rng.randint(1, 12)):
            piece = "".join(rng.choices("abc", k=rng.randint(0, 3)))
            text += piece
            # What the stream did before: once a stop occurs anywhere in the text, every token may be the last.
            assert _feed(state, piece) == any(s in text for s in stops), (stops, text)


def test_a_long_answer_keeps_only_a_bounded_tail_and_its_text_once():
    state = _Events(GenerateParameters(stop=["NEVER-HERE", "END"], details=False, return_full_text=True), "Q:")
    for _ in range(10_000):
        assert not _feed(state, "some text ")
    assert len(state._tail) <= len("NEVER-HERE") - 1  # not the 100k characters generated so far
    assert not _feed(state, "EN") and _feed(state, "D")
    response = state.finish(state.tokens(Chunk(text="!", tokens=[TokenInfo(6, "!", -0.1)]))[0], Chunk(final=True))
    assert response.generated_text == "Q:" + "some text " * 10_000 + "END!"


def test_an_empty_stop_string_holds_nothing():
    state = _Events(GenerateParameters(stop=[""]), "")
    assert not _feed(state, "a") and not _feed(state, "b")
