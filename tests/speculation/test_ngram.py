"""Prompt lookup (NgramIndex.propose): the longest suffix that occurred before wins, at its latest
occurrence; proposals are bounded by max_tokens and by the end of the history; an index extended across
calls proposes what a brute-force search of the whole list proposes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tgi_llm.speculation import NgramIndex


def reference(tokens: list[int], max_tokens: int, max_ngram: int = 4, min_ngram: int = 1) -> list[int]:
    """Brute force: for n = max_ngram..min_ngram, the latest earlier occurrence of the last n tokens (an
    occurrence ending before the last token), and what followed it."""
    if max_tokens <= 0 or len(tokens) < 2:
        return []
    last = len(tokens) - 1
    for n in range(min(max_ngram, last), min_ngram - 1, -1):
        suffix = tokens[last - n + 1:]
        for end in range(last - 1, n - 2, -1):
            if tokens[end - n + 1: end + 1] == suffix:
                return tokens[end + 1: end + 1 + max_tokens]
    return []


def test_the_longest_suffix_wins_over_a_later_shorter_one():
    """[1 2 3] occurred first followed by 10; [3] alone occurred later followed by 20: the 3-gram match
    wins although the 1-gram match is more recent."""
    tokens = [1, 2, 3, 10, 11, 7, 3, 20, 21, 1, 2, 3]
    assert NgramIndex().propose(tokens, 2) == [10, 11]
    assert reference(tokens, 2) == [10, 11]


def test_the_latest_occurrence_wins():
    tokens = [5, 6, 100, 5, 6, 200, 201, 9, 5, 6]
    assert NgramIndex().propose(tokens, 3) == [200, 201, 9]


def test_max_ngram_bounds_the_suffix_length():
    """With max_ngram=1 only the last token is looked up: its latest occurrence wins, not the longer
    context match."""
    tokens = [1, 2, 3, 10, 3, 20, 1, 2, 3]
    assert NgramIndex().propose(tokens, 1) == [10]
    assert NgramIndex(max_ngram=1).propose(tokens, 1) == [20]


def test_max_tokens_is_respected_and_the_continuation_stops_at_the_end_of_history():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert NgramIndex().propose(tokens, 3) == [3, 4, 5]
    assert NgramIndex().propose(tokens, 100) == [3, 4, 5, 6, 1, 2]  # up to the sequence's own end
    # The latest occurrence is the one just before the last token: a single token follows it.
    assert NgramIndex().propose([9, 7, 7], 4) == [7]


@pytest.mark.parametrize("tokens, max_tokens", [
    ([], 4), ([3], 4),            # too short
    ([1, 2, 3, 4, 5], 4),         # the last token never occurred before
    ([1, 2, 1], 0), ([1, 2, 1], -1),  # nothing asked for
])
def test_nothing_is_proposed_without_a_match_or_room(tokens, max_tokens):
    assert NgramIndex().propose(tokens, max_tokens) == []


def test_min_ngram_refuses_shorter_matches():
    tokens = [4, 8, 1, 5, 4, 8]
    assert NgramIndex(min_ngram=2).propose(tokens, 2) == [1, 5]
    assert NgramIndex(min_ngram=2).propose([4, 8, 1, 5, 9, 8], 2) == []  # only the 1-gram [8] matched
    assert NgramIndex().propose([4, 8, 1, 5, 9, 8], 2) == [1, 5]


def grow_and_compare(tokens: list[int], cuts: list[int], max_tokens: int, max_ngram: int) -> None:
    """One index fed ever longer prefixes of `tokens` (as a sequence grows, several tokens per step when
    drafts are accepted) proposes at every prefix what a fresh index and the brute force propose."""
    index = NgramIndex(max_ngram=max_ngram)
    for cut in cuts:
        prefix = tokens[:cut]
        want = reference(prefix, max_tokens, max_ngram)
        assert index.propose(prefix, max_tokens) == want, (prefix, max_tokens)
        assert NgramIndex(max_ngram=max_ngram).propose(prefix, max_tokens) == want


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), min_size=0, max_size=60), data=st.data())
def test_an_index_grown_across_calls_agrees_with_brute_force(tokens, data):
    max_ngram = data.draw(st.integers(1, 5))
    max_tokens = data.draw(st.integers(1, 6))
    steps = data.draw(st.lists(st.integers(1, 5), max_size=40))  # tokens appended between proposals
    cuts, cut = [], 0
    for step in steps:
        cut = min(cut + step, len(tokens))
        cuts.append(cut)
    grow_and_compare(tokens, cuts, max_tokens, max_ngram)


def test_long_random_histories_one_token_at_a_time():
    """Sequences of a few hundred tokens over small and larger alphabets, proposed after every token."""
    rng = random.Random(0)
    for alphabet in (2, 3, 8, 50):
        tokens = [rng.randrange(alphabet) for _ in range(300)]
        grow_and_compare(tokens, list(range(len(tokens) + 1)), rng.randint(1, 8), 4)
