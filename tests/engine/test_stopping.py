"""StopChecker: TGI's StoppingCriteria order (length, then EOS, then stop sequences)."""

from __future__ import annotations

from tgi_llm.engine.stopping import StopChecker
from tgi_llm.events import FinishReason
from tgi_llm.request import StoppingParams

EOS = {2, 7}


def _run(checker: StopChecker, steps: list[tuple[int, str]]) -> list[FinishReason | None]:
    return [checker.check(token, text) for token, text in steps]


def test_length_on_the_max_new_tokens_th_token():
    results = _run(StopChecker(EOS, StoppingParams(max_new_tokens=3)), [(10, "a"), (11, "b"), (12, "c")])
    assert results == [None, None, FinishReason.LENGTH]


def test_every_eos_id_stops_unless_ignored():
    for eos in EOS:
        assert _run(StopChecker(EOS, StoppingParams(10)), [(10, "a"), (eos, "")]) == [
            None,
            FinishReason.EOS_TOKEN,
        ]
    ignoring = StopChecker(EOS, StoppingParams(3, ignore_eos=True))
    assert _run(ignoring, [(2, ""), (7, ""), (2, "")]) == [None, None, FinishReason.LENGTH]


def test_length_wins_on_the_last_token_as_in_tgi():
    assert _run(StopChecker(EOS, StoppingParams(2)), [(10, "a"), (2, "")])[-1] == FinishReason.LENGTH
    stopper = StopChecker(EOS, StoppingParams(2, stop_sequences=("ab",)))
    assert _run(stopper, [(10, "a"), (11, "b")])[-1] == FinishReason.LENGTH
    # EOS is checked before stop sequences.
    both = StopChecker(EOS, StoppingParams(5, stop_sequences=("x",)))
    assert both.check(2, "x") == FinishReason.EOS_TOKEN


def test_stop_sequence_across_token_boundaries():
    checker = StopChecker(EOS, StoppingParams(100, stop_sequences=("never", "lo Wor")))
    assert _run(checker, [(1, "Hel"), (1, ""), (1, "lo W"), (1, "orld")]) == [
        None,
        None,
        None,
        FinishReason.STOP_SEQUENCE,
    ]


def test_stop_sequence_inside_one_delta_followed_by_more_text():
    checker = StopChecker(EOS, StoppingParams(100, stop_sequences=("\n\n",)))
    assert checker.check(1, "first\n") is None
    assert checker.check(1, "\nsecond") == FinishReason.STOP_SEQUENCE


def test_near_misses_do_not_stop():
    checker = StopChecker(EOS, StoppingParams(100, stop_sequences=("abc",)))
    assert _run(checker, [(1, "ab"), (1, "x"), (1, "c"), (1, "a"), (1, "bd")]) == [None] * 5


def test_only_a_bounded_tail_is_kept():
    checker = StopChecker(EOS, StoppingParams(10_000, stop_sequences=("STOP", "xy")))
    for _ in range(2_000):
        assert checker.check(1, "some text ") is None
    assert len(checker._tail) <= 3  # longest stop sequence - 1
    assert checker.check(1, "ST") is None
    assert checker.check(1, "OP") == FinishReason.STOP_SEQUENCE
    assert checker.generated_tokens == 2_002


def test_nothing_but_length_stops_before_min_new_tokens():
    checker = StopChecker(EOS, StoppingParams(10, stop_sequences=("ab",), min_new_tokens=3))
    assert _run(checker, [(2, ""), (10, "a"), (11, "b")]) == [None, None, None]  # EOS and "ab" too early
    assert _run(checker, [(12, "a"), (13, "b")]) == [None, FinishReason.STOP_SEQUENCE]
    spanning = StopChecker(EOS, StoppingParams(10, stop_sequences=("xy",), min_new_tokens=2))
    assert _run(spanning, [(10, "q"), (11, "x"), (12, "y")]) == [None, None, FinishReason.STOP_SEQUENCE]
    assert _run(StopChecker(EOS, StoppingParams(2, min_new_tokens=2)), [(2, ""), (2, "")]) == [
        None, FinishReason.LENGTH]


def test_a_completed_grammar_stops_even_when_eos_is_ignored():
    checker = StopChecker(EOS, StoppingParams(10, ignore_eos=True))
    assert checker.check(2, "", grammar_done=True) is FinishReason.EOS_TOKEN
