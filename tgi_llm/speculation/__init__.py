"""Speculative decoding (`--speculate N`): guess a sequence's next tokens cheaply, verify them all in the
step's one forward (runner/verify.py), keep the ones the model would have chosen itself.

- `ngram.py`: the prompt-lookup proposer, a guess from where the sequence's latest tokens occurred before.
- `policy.py`: how many tokens each sequence guesses, from its recent acceptance and the measured cost of a
  step's extra rows.
"""

from tgi_llm.speculation.ngram import NgramIndex
from tgi_llm.speculation.policy import DraftLength, SpeculationPolicy

__all__ = ["DraftLength", "NgramIndex", "SpeculationPolicy"]
