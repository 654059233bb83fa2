"""Turns sampled tokens into events: detokenize, check stop criteria, build the final event."""

from __future__ import annotations

import time
from typing import Any

from tgi_llm.engine.detokenizer import IncrementalDetokenizer
from tgi_llm.engine.runner_protocol import SeqResult
from tgi_llm.engine.sequence import Sequence
from tgi_llm.engine.stopping import StopChecker
from tgi_llm.events import FinalEvent, FinishReason, PrefillToken, Token, TokenEvent


class Postprocessor:
    def __init__(self, tokenizer: Any, eos_token_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.special_ids = set(getattr(tokenizer, "all_special_ids", []))
        self._detok: dict[int, IncrementalDetokenizer] = {}
        self._stop: dict[int, StopChecker] = {}
        self._prefill: dict[int, list[PrefillToken]] = {}

    def admit(self, seq: Sequence) -> None:
        self._detok[seq.request_id] = IncrementalDetokenizer(self.tokenizer, list(seq.request.input_ids))
        self._stop[seq.request_id] = StopChecker(self.eos_token_ids, seq.request.stopping)

    def release(self, seq: Sequence) -> None:
        self._detok.pop(seq.request_id, None)
        self._stop.pop(seq.request_id, None)
        self._prefill.pop(seq.request_id, None)

    def process(self, seq: Sequence, result: SeqResult) -> tuple[TokenEvent, FinalEvent | None]:
        """Record one sampled token: its TokenEvent, and the FinalEvent when the sequence ends."""
        if result.prompt_logprobs is not None:
            self._prefill[seq.request_id] = self._prefill_tokens(seq, result.prompt_logprobs)
        seq.num_computed = len(seq.token_ids)
        seq.token_ids.append(result.token_id)
        detok = self._detok[seq.request_id]
        delta = detok.step(result.token_id)
        seq.text += delta
        reason = self._stop[seq.request_id].check(result.token_id, delta)
        if reason is not None:
            tail = detok.finish()
            seq.text += tail
            delta += tail
        token = Token(result.token_id, delta, result.logprob, result.token_id in self.special_ids)
        top = [
            Token(i, self._piece(i), lp, i in self.special_ids)
            for i, lp in zip(result.top_ids, result.top_logprobs, strict=True)
        ]
        seq.tokens.append(token)
        if seq.request.top_n_tokens:
            seq.top_tokens.append(top)
        event = TokenEvent(seq.request_id, seq.num_generated - 1, token, top, last=reason is not None)
        return event, (None if reason is None else self._final(seq, reason))

    def _final(self, seq: Sequence, reason: FinishReason) -> FinalEvent:
        req = seq.request
        text = seq.text
        if req.return_full_text:
            prompt = req.input_text
            if prompt is None:
                prompt = self.tokenizer.decode(list(req.input_ids), skip_special_tokens=False)
            text = prompt + text
        now = time.monotonic()
        admitted = seq.admitted_at or now
        return FinalEvent(
            request_id=seq.request_id,
            generated_text=text,
            finish_reason=reason,
            generated_tokens=seq.num_generated,
            input_tokens=seq.input_length,
            seed=req.sampling.seed if req.sampling.do_sample else None,
            token_ids=seq.token_ids[seq.input_length:],
            tokens=list(seq.tokens),
            top_tokens=list(seq.top_tokens),
            prefill=self._prefill.get(seq.request_id, []),
            queue_time_s=admitted - seq.queued_at,
            inference_time_s=now - admitted,
        )

    def _prefill_tokens(self, seq: Sequence, logprobs: list[float]) -> list[PrefillToken]:
        ids = seq.request.input_ids
        lps: list[float | None] = [None, *logprobs]
        return [PrefillToken(i, self._piece(i), lp) for i, lp in zip(ids, lps, strict=True)]

    def _piece(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)
