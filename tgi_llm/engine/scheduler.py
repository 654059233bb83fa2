"""Which sequences compute which tokens in the next forward: `schedule() -> StepPlan`, then
`update(plan, results)` advances every sequence of the step, in one place.

Requests get every KV block their whole life can fill at admission (TGI v3: no preemption), prompt
blocks already in the prefix cache reused (kv_cache_manager.py). Two admission policies:

- chunked prefill (default, TGI v3 with chunking): each step has a token budget
  (`max_batch_prefill_tokens`). Running decodes come first (one token each), then prompts still being
  prefilled, then waiting requests in the order of `--scheduling-policy` (queue_order.py: the shortest
  prompt first, aged, once prefill's cost is measured; or arrival), each cut to what remains of the
  budget and continued in the next step. Waiting requests join at every step while the budget, the KV
  blocks and `max_batch_size` allow (TGI v3 ignores waiting_served_ratio and max_waiting_tokens when
  chunking).
- whole prompts (PREFILL_CHUNKING=0): TGI v3's `next_batch`. A prompt is prefilled in one step; while a
  batch runs, new requests join only when enough are waiting (`waiting_served_ratio`) or the queue has
  waited `max_waiting_tokens` steps, within the prefill and total token budgets.

With `--speculate N` each decode may feed up to N guessed tokens after its last one (speculation/): as
many as its remaining max_new_tokens allow, so they fit the blocks it was given at admission, and only
while its acceptance rate pays for the rows at this batch size. Decodes without guesses come first, then
those with guesses, then prompt chunks (the order step_plan.py states).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Sequence as Seq

from tgi_llm.engine.kv_cache_manager import KVCacheManager
from tgi_llm.engine.limits import Limits
from tgi_llm.engine.pacing import StepPacer
from tgi_llm.engine.queue_order import admission_order
from tgi_llm.engine.runner_protocol import SeqResult
from tgi_llm.engine.sequence import Sequence, SequenceStatus
from tgi_llm.engine.step_plan import ScheduledSeq, StepPlan
from tgi_llm.lora.registry import LoraRegistry
from tgi_llm.speculation import DraftLength, SpeculationPolicy
from tgi_llm.speculation.proposer import DraftRequest, NgramProposer, Proposer

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, limits: Limits, kv: KVCacheManager, proposer: Proposer | None = None,
                 lora: LoraRegistry | None = None) -> None:
        self.limits = limits
        self.kv = kv
        #: The LoRA adapters' slots: a request with an adapter is admitted only when its adapter has one.
        self.lora = lora
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}  # request id -> sequence, in admission order
        #: Steps since sequences were last admitted (TGI's `waiting_tokens`; whole-prompt policy only).
        self.waiting_steps = 0
        self._released: list[int] = []
        target_ms = limits.prefill_step_target_ms
        self.pacer = StepPacer(target_ms / 1000 if target_ms else None, min_tokens=limits.block_size)
        self.speculation = SpeculationPolicy(limits.speculate)
        #: Where guesses come from (with --speculate): prompt lookup unless a draft model is given.
        self.proposer: Proposer = proposer or NgramProposer()
        #: Draft tokens verified and accepted since start (vLLM's spec_decode counters), and verify steps.
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0

    @property
    def batch_max_tokens(self) -> int:
        return sum(s.max_tokens for s in self.running.values())

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    # ---- planning ----
    def schedule(self) -> StepPlan:
        if self.limits.prefill_chunking:
            entries = self._schedule_chunked()
        else:
            entries = self._schedule_whole()
        released, self._released = self._released, []
        return StepPlan(entries, released, self.lora.take_loads() if self.lora is not None else [])

    def _schedule_chunked(self) -> list[ScheduledSeq]:
        lim = self.limits
        decodes = [s for s in self.running.values() if s.num_computed >= s.input_length]
        prefills = [s for s in self.running.values() if s.num_computed < s.input_length]
        entries = self._decode_entries(decodes)
        # Prompts always move by at least a block, however many streams decode.
        budget = self.pacer.step_budget(lim.max_batch_prefill_tokens - sum(e.num_tokens for e in entries),
                                        bool(decodes),
                                        floor=min(self.pacer.min_tokens, lim.max_batch_prefill_tokens))
        for seq in prefills:
            if budget.exhausted:
                break
            if n := budget.take(seq.num_computed, seq.num_pending):
                entries.append(self._entry(seq, n))
        # A prompt another running request is still prefilling waits for it, then finds it all cached: n
        # choices and best_of sequences (sent at once) compute their shared prompt once.
        worth = 2 * lim.block_size  # a shorter prefill is not worth waiting for
        twins = {s.prompt_key for s in prefills if s.num_pending > worth} if self.kv.enable_prefix_caching else set()
        if budget.exhausted:
            return entries  # nothing to admit: the queue is not sorted
        order = admission_order(self.waiting, lim.scheduling_policy, self.pacer.seconds_per_token, time.monotonic())
        for seq in order:
            if budget.exhausted or (lim.max_batch_size is not None and len(self.running) >= lim.max_batch_size):
                break
            if seq.prompt_key in twins and seq.cache_lookup:
                continue  # stays in the queue, in its place
            if not self._adapter_fits(seq):
                continue  # every LoRA slot is pinned by running requests of other adapters
            if not self._admit(seq):
                logger.debug("not enough free KV blocks for request %d", seq.request_id)
                break
            if self.kv.enable_prefix_caching and seq.num_pending > worth:
                twins.add(seq.prompt_key)
            if n := budget.take(seq.num_computed, seq.num_pending):  # 0: admitted, its chunk comes next step
                entries.append(self._entry(seq, n))
        return entries

    def _schedule_whole(self) -> list[ScheduledSeq]:
        lim = self.limits
        if not self.running:
            admitted = self._next_batch(None, lim.max_batch_size, lim.max_batch_prefill_tokens,
                                        lim.max_batch_total_tokens)
        else:
            batch_size = len(self.running)
            min_size = None
            if self.waiting_steps < lim.max_waiting_tokens:
                min_size = math.floor(batch_size * lim.waiting_served_ratio)
            max_size = None if lim.max_batch_size is None else max(lim.max_batch_size - batch_size, 0)
            token_budget = max(lim.max_batch_total_tokens - self.batch_max_tokens, 0)
            admitted = self._next_batch(min_size, max_size, lim.max_batch_prefill_tokens, token_budget)
        new = {s.request_id for s in admitted}
        decodes = [s for s in self.running.values() if s.request_id not in new]
        if admitted:
            self.waiting_steps = 0
        if decodes or admitted:
            self.waiting_steps += 1
        return self._decode_entries(decodes) + [self._entry(s, s.num_pending) for s in admitted]

    def _next_batch(self, min_size: int | None, max_size: int | None, prefill_token_budget: int,
                    token_budget: int) -> list[Sequence]:
        """TGI's next_batch: pop sequences from the front of the queue while they fit; all or nothing
        w.r.t. min_size. Prompt tokens found in the prefix cache do not count against the prefill budget."""
        if not self.waiting or max_size == 0:
            return []
        if min_size is not None and len(self.waiting) < min_size:
            return []
        bs = self.limits.block_size
        prefill_token_budget = -(-prefill_token_budget // bs) * bs
        batch: list[Sequence] = []
        total_tokens = 0  # prompts + max_new_tokens: TGI's prefill_tokens + decode_tokens
        prefill_tokens = 0  # prompt tokens not found in the prefix cache
        while self.waiting:
            seq = self.waiting[0]
            if not self._adapter_fits(seq):
                break
            if total_tokens + seq.max_tokens > token_budget:
                logger.debug("Over budget: %d + %d > %d tokens", total_tokens, seq.max_tokens, token_budget)
                break
            if not self._admit(seq):
                logger.debug("Over budget: not enough free blocks")
                break
            if prefill_tokens + seq.num_pending > prefill_token_budget:
                logger.debug("Over budget: prefill_tokens=%d > %d", prefill_tokens + seq.num_pending,
                             prefill_token_budget)
                self._unadmit(seq)
                break
            total_tokens += seq.max_tokens
            prefill_tokens += seq.num_pending
            batch.append(seq)
            if max_size is not None and len(batch) == max_size:
                break
        if min_size is not None and len(batch) < min_size:
            for seq in reversed(batch):
                self._unadmit(seq)
            return []
        return batch

    def _adapter_fits(self, seq: Sequence) -> bool:
        adapter = seq.request.lora
        return adapter is None or self.lora is None or self.lora.can_admit(adapter)

    def _admit(self, seq: Sequence) -> bool:
        """Take `seq` from the queue into the running batch with its KV blocks (and its LoRA adapter's slot,
        after `_adapter_fits`); False if they don't fit."""
        # The last generated token is never fed back, so its K/V needs no slot.
        cached = self.kv.allocate(seq, seq.max_tokens - 1)
        if cached is None:
            return False
        if seq.request.lora is not None and self.lora is not None:
            seq.lora_slot = self.lora.admit(seq.request.lora)
        if self.waiting[0] is seq:
            self.waiting.popleft()
        else:
            self.waiting.remove(seq)  # by identity (Sequence compares as an object)
        seq.num_computed = seq.num_cached = cached
        seq.status = SequenceStatus.RUNNING
        seq.admitted_at = time.monotonic()
        self.running[seq.request_id] = seq
        if seq.cache_lookup and self.kv.enable_prefix_caching:
            self.kv.counters.queried_tokens += seq.input_length
            self.kv.counters.hit_tokens += cached
        return True

    def _unadmit(self, seq: Sequence) -> None:
        """Undo `_admit` (whole-prompt policy: the batch did not reach its minimum size)."""
        del self.running[seq.request_id]
        if seq.cache_lookup and self.kv.enable_prefix_caching:
            self.kv.counters.queried_tokens -= seq.input_length
            self.kv.counters.hit_tokens -= seq.num_cached
        self.kv.free(seq)
        self._leave_slot(seq)
        seq.num_computed = seq.num_cached = 0
        seq.status = SequenceStatus.WAITING
        seq.admitted_at = None
        self.waiting.appendleft(seq)

    def _entry(self, seq: Sequence, n: int, drafts: Seq[int] = ()) -> ScheduledSeq:
        """`seq`'s next `n` known tokens, then the draft tokens it guessed after them."""
        start = seq.num_computed
        end = start + n
        return ScheduledSeq(
            request_id=seq.request_id, start=start, token_ids=[*seq.token_ids[start:end], *drafts],
            block_ids=self.kv.block_ids(seq), samples=end == len(seq.token_ids),
            prompt_logprobs=seq.request.decoder_input_details and start < seq.input_length,
            request=seq.request, is_decode=start >= seq.input_length, num_drafts=len(drafts),
            lora_slot=seq.lora_slot,
        )

    def _decode_entries(self, decodes: list[Sequence]) -> list[ScheduledSeq]:
        """One entry per decode: its last token and its guesses, those without guesses first."""
        plain, verifying = [], []
        break_even = self.speculation.break_even(len(decodes)) if self.speculation.enabled else 1.0
        lengths = [self._draft_length(seq, break_even) for seq in decodes]
        asks = [DraftRequest(seq.request_id, seq.token_ids, self.kv.block_ids(seq), n)
                for seq, n in zip(decodes, lengths, strict=True) if n]
        proposals = iter(self.proposer.propose(asks) if asks else [])
        for seq, n in zip(decodes, lengths, strict=True):
            drafts = next(proposals) if n else []
            (verifying if drafts else plain).append(self._entry(seq, 1, drafts))
        return plain + verifying

    def _draft_length(self, seq: Sequence, break_even: float) -> int:
        """How many tokens `seq` guesses this step: none when they cannot pay for their rows."""
        if not self.speculation.enabled:
            return 0
        speculate = seq.request.speculate
        limit = self.speculation.limit if speculate is None else min(speculate, self.speculation.limit)
        if limit <= 0:
            return 0
        if seq.draft_length is None:
            seq.draft_length = DraftLength(limit)
        room = seq.request.stopping.max_new_tokens - seq.num_generated - 1  # the blocks admission gave it
        n = min(seq.draft_length.current, limit, room)
        if n <= 0 or seq.draft_length.acceptance <= break_even:
            return 0
        return n

    # ---- after the forward ----
    def update(self, plan: StepPlan, results: Seq[SeqResult | None]) -> list[tuple[Sequence, int]]:
        """Advance every sequence of the step: computed tokens, prompt logprobs, the chosen tokens (their
        detokenizing and stop checks, up to the one that ends the sequence), newly full blocks into the
        prefix cache. Returns the sequences that got tokens this step with how many, in plan order."""
        sampled = []
        for entry, result in zip(plan.seqs, results, strict=True):
            if result is not None and result.error is not None:
                continue  # the engine ends it with its error
            seq = self.running[entry.request_id]
            seq.num_computed = entry.end
            if result is not None and result.prompt_logprobs:
                seq.prompt_logprobs.extend(result.prompt_logprobs)
                seq.prompt_top.extend(result.prompt_top or [])
            if entry.samples:
                assert result is not None and result.tokens, f"request {entry.request_id} sampled nothing"
                accepted = result.num_accepted
                last = len(result.tokens) - 1
                added = 0
                for i, token in enumerate(result.tokens):
                    seq.append_token(token.token_id, token.logprob, token.top_ids, token.top_logprobs,
                                     result.grammar_done and i == last)
                    added += 1
                    if seq.finish_reason is not None:
                        break
                # Rejected guesses' K/V are not the sequence's: the next step overwrites them. (A stop inside
                # an accepted run leaves fewer tokens than computed rows.)
                seq.num_computed = min(entry.end - entry.num_drafts + accepted, len(seq.token_ids))
                if entry.num_drafts:
                    self.proposer.rewind(seq.request_id, seq.num_computed)
                    self._count_drafts(seq, entry.num_drafts, accepted, kept=min(accepted, added))
                elif seq.draft_length is not None:
                    seq.draft_length.skipped()
                sampled.append((seq, added))
            self.kv.cache_computed(seq)
        return sampled

    def _count_drafts(self, seq: Sequence, drafted: int, accepted: int, kept: int) -> None:
        """Verification counts for the metrics; the request's own count is of the accepted tokens it kept
        (a stop inside an accepted run drops the rest)."""
        assert seq.draft_length is not None
        seq.draft_length.observe(drafted, accepted)
        seq.drafted_tokens += drafted
        seq.accepted_tokens += kept
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted

    def finish(self, seq: Sequence) -> None:
        """Take a sequence out of the batch or the queue and give its blocks back (its cached blocks stay
        reusable)."""
        seq.status = SequenceStatus.FINISHED
        self.proposer.release(seq.request_id)
        if self.running.pop(seq.request_id, None) is not None:
            self._released.append(seq.request_id)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.kv.free(seq)
        self._leave_slot(seq)

    def _leave_slot(self, seq: Sequence) -> None:
        if seq.lora_slot >= 0 and self.lora is not None:
            self.lora.leave(seq.lora_slot)
        seq.lora_slot = -1
