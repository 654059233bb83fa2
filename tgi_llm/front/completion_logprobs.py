"""OpenAI's legacy completions `logprobs` object: tokens, token_logprobs, top_logprobs and text_offset,
the prompt's first (with `echo`: its first token has no logprob, null) then the generated tokens'.

What lm-evaluation-harness reads for every loglikelihood task: it sends `echo: true, logprobs: 1,
max_tokens: 1` and sums token_logprobs over the continuation, checking greediness against top_logprobs.
"""

from __future__ import annotations

from typing import Any

from tgi_llm.front.protocol import TokenInfo


def completion_logprobs(prompt: list[TokenInfo], generated: list[TokenInfo], generated_tops: list[list[TokenInfo]],
                        start_offset: int = 0) -> dict[str, Any]:
    """`prompt`: the echoed prompt tokens (empty without echo), each with its best alternatives in `top`;
    `generated`: the new tokens, with their alternatives in `generated_tops`."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = start_offset
    rows = [(t, t.top, i == 0) for i, t in enumerate(prompt)]
    rows += [(t, generated_tops[i] if i < len(generated_tops) else [], False) for i, t in enumerate(generated)]
    for token, top, first in rows:
        out["tokens"].append(token.text)
        out["token_logprobs"].append(None if first else token.logprob)
        out["top_logprobs"].append(None if first else {alt.text: alt.logprob for alt in top})
        out["text_offset"].append(offset)
        offset += len(token.text)
    return out
