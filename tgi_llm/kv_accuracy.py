"""How far a 16- or 8-bit KV cache is from the float32 one: teacher-forced top-1 agreement and mean |Δ logprob|.

The same model reads the same held-out text (tgi_llm/quant/accuracy.py) in one prefill per sequence, once over
a float32 cache and once over the cache type under test. Attention reads every key and value from the cache,
its own token's included, as decode steps would read them, so one prefill measures what a generation of that
length sees. Only each position's argmax and the log-probability of the text's next token are kept: the
logits of a 16k-token sequence alone would be 3 GB.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tgi_llm.quant.accuracy import Agreement, prefill_hidden

#: Rows of hidden states turned into logits at a time (a row is vocab_size floats).
_LOGIT_ROWS = 1024


@dataclass(frozen=True)
class NextTokenStats:
    """Position t of a sequence: what the model ranks first after it, and the log-probability it gives the
    text's token t + 1 (the last position predicts nothing and is left out)."""

    argmax: torch.Tensor  # [n - 1] int64
    logprob: torch.Tensor  # [n - 1] float32


def sequence_stats(model, ids: list[int], kv_dtype: torch.dtype, block_size: int = 16) -> NextTokenStats:
    """One sequence in one prefill over a KV cache of `kv_dtype` of its own."""
    n = len(ids)
    hidden = prefill_hidden(model, model.config, ids, kv_dtype, block_size)[: n - 1]
    following = torch.tensor(ids[1:])
    argmax, logprob = [], []
    with torch.inference_mode():
        for start in range(0, n - 1, _LOGIT_ROWS):
            rows = model.compute_logits(hidden[start:start + _LOGIT_ROWS]).float().log_softmax(-1)
            argmax.append(rows.argmax(-1))
            logprob.append(rows.gather(1, following[start:start + rows.shape[0], None])[:, 0])
    return NextTokenStats(torch.cat(argmax), torch.cat(logprob))


def agreement(reference: list[NextTokenStats], measured: list[NextTokenStats]) -> Agreement:
    """Top-1 agreement and mean |Δ logprob| over every position of every sequence."""
    same = sum(int((r.argmax == m.argmax).sum()) for r, m in zip(reference, measured, strict=True))
    diffs = torch.cat([(r.logprob - m.logprob).abs() for r, m in zip(reference, measured, strict=True)])
    return Agreement(diffs.numel(), same / diffs.numel(), float(diffs.mean()))
