"""The rows a step chooses tokens at, and which of their choices it keeps.

Each sampling sequence has one row per token it fed from its last sampled one: row r chooses what follows
its first r draft tokens. The sequence keeps its drafts while each equals the choice of the row before
it, then the first choice that differs (or the one after its last draft).
"""

from __future__ import annotations

from dataclasses import dataclass

from tgi_llm.engine.step_plan import ScheduledSeq


@dataclass(frozen=True)
class SampledRows:
    #: Per sequence: the drafts it verifies (its grammar may have cut them: their rows go unused).
    drafts: list[list[int]]
    #: Per sequence: its first row.
    firsts: list[int]
    #: Per row: its sequence, and how many of that sequence's drafts precede it.
    owner: list[int]
    depth: list[int]
    #: Per row: its row in the step's sampled logits (each sequence's 1 + num_drafts rows, in order).
    logits_rows: list[int]

    @classmethod
    def of(cls, entries: list[ScheduledSeq], drafts: list[list[int]]) -> SampledRows:
        firsts, logits_rows = [], []
        offset = 0
        for entry, d in zip(entries, drafts, strict=True):
            firsts.append(len(logits_rows))
            logits_rows.extend(range(offset, offset + 1 + len(d)))
            offset += entry.num_sampled_rows
        owner = [j for j, d in enumerate(drafts) for _ in range(1 + len(d))]
        depth = [r for d in drafts for r in range(1 + len(d))]
        return cls(drafts, firsts, owner, depth, logits_rows)

    @property
    def num_rows(self) -> int:
        return len(self.owner)

    def kept(self, choices: list[int]) -> list[list[int]]:
        """Per sequence, the tokens it keeps given every row's choice: accepted drafts, then one more."""
        out = []
        for first, d in zip(self.firsts, self.drafts, strict=True):
            accepted = 0
            while accepted < len(d) and choices[first + accepted] == d[accepted]:
                accepted += 1
            out.append(choices[first: first + accepted + 1])
        return out
