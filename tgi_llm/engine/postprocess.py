"""Events from sequences: the TokenEvent of the token a step just added, the FinalEvent of a finished
sequence. Reads sequences only; `Scheduler.update` is what advances them."""

from __future__ import annotations

import math
import time
from typing import Any

from tgi_llm.engine.sequence import Sequence
from tgi_llm.events import FinalEvent, PrefillToken, Token, TokenEvent


class Postprocessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.special_ids = set(getattr(tokenizer, "all_special_ids", []))

    def token_event(self, seq: Sequence, i: int) -> TokenEvent:
        """The event of `seq`'s i-th generated token (a step may add several: accepted draft tokens)."""
        token_id = seq.token_ids[seq.input_length + i]
        token = Token(token_id, seq.deltas[i], seq.logprobs[i], token_id in self.special_ids)
        top = self._top(seq.top[i]) if seq.top else []
        last = seq.finish_reason is not None and i == seq.num_generated - 1
        return TokenEvent(seq.request_id, i, token, top, last=last)

    def final_event(self, seq: Sequence) -> FinalEvent:
        req = seq.request
        assert seq.finish_reason is not None
        text = seq.text
        if req.return_full_text:
            prompt = req.input_text
            if prompt is None:
                prompt = self.tokenizer.decode(list(req.input_ids), skip_special_tokens=False)
            text = prompt + text
        now = time.monotonic()
        admitted = seq.admitted_at or now
        generated = seq.token_ids[seq.input_length:]
        return FinalEvent(
            request_id=seq.request_id,
            generated_text=text,
            finish_reason=seq.finish_reason,
            generated_tokens=seq.num_generated,
            input_tokens=seq.input_length,
            seed=req.sampling.seed if req.sampling.do_sample else None,
            token_ids=generated,
            tokens=[Token(t, d, lp, t in self.special_ids)
                    for t, d, lp in zip(generated, seq.deltas, seq.logprobs, strict=True)],
            top_tokens=[self._top(top) for top in seq.top],
            prefill=self._prefill_tokens(seq) if req.decoder_input_details else [],
            cached_tokens=seq.num_cached,
            draft_tokens=seq.drafted_tokens,
            accepted_draft_tokens=seq.accepted_tokens,
            queue_time_s=admitted - seq.queued_at,
            inference_time_s=now - admitted,
        )

    def _top(self, top: tuple[list[int], list[float]]) -> list[Token]:
        """The alternatives the sampler could have drawn: one that top_k, a grammar or a held end-of-sequence
        ruled out has logprob -inf, which is no alternative (and no JSON number)."""
        return [Token(i, self._piece(i), lp, i in self.special_ids) for i, lp in zip(*top, strict=True)
                if math.isfinite(lp)]

    def _prefill_tokens(self, seq: Sequence) -> list[PrefillToken]:
        lps: list[float | None] = [None, *seq.prompt_logprobs]
        tops: list[list[Token]] = [[], *(self._top(t) for t in seq.prompt_top)] if seq.prompt_top else []
        return [PrefillToken(i, self._piece(i), lp, tops[k] if tops else [])
                for k, (i, lp) in enumerate(zip(seq.request.input_ids, lps, strict=True))]

    def _piece(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)
