"""Which rows a step chooses at, and which choices each sequence keeps."""

from __future__ import annotations

from tgi_llm.engine.step_plan import ScheduledSeq
from tgi_llm.runner.sampled_rows import SampledRows


def _entry(request_id: int, drafts: list[int]) -> ScheduledSeq:
    return ScheduledSeq(request_id, 10, [7, *drafts], [0], samples=True, is_decode=True, num_drafts=len(drafts))


def test_rows_follow_each_sequence_and_skip_the_rows_of_cut_drafts():
    entries = [_entry(1, []), _entry(2, [5, 6, 7]), _entry(3, [8])]
    rows = SampledRows.of(entries, [[], [5], [8]])  # the second sequence's grammar cut its drafts to one
    assert rows.firsts == [0, 1, 3]
    assert rows.owner == [0, 1, 1, 2, 2] and rows.depth == [0, 0, 1, 0, 1]
    assert rows.logits_rows == [0, 1, 2, 5, 6]  # rows 3 and 4 (after the cut drafts) go unused


def test_drafts_are_kept_while_they_equal_the_choice_before_them():
    entries = [_entry(1, [5, 6, 7]), _entry(2, [8, 9]), _entry(3, [])]
    rows = SampledRows.of(entries, [e.drafts for e in entries])
    choices = [5, 6, 4, 0,  # 5 and 6 accepted, then 4 instead of 7
               3, 9, 9,  # 8 rejected at once: the row after it means nothing
               2]
    assert rows.kept(choices) == [[5, 6, 4], [3], [2]]
    assert rows.kept([5, 6, 7, 1, 8, 9, 4, 2]) == [[5, 6, 7, 1], [8, 9, 4], [2]]  # all accepted, plus one
