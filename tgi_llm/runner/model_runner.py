"""The model server half of a step: one forward over the plan's flat batch, then per-request sampling.

`forward_plan` is all a shard rank runs; sampling and the per-request records live only here, on rank 0.

A decode with draft tokens has a sampled row per token it fed: row r chooses what follows the draft's
first r tokens, exactly as a step without speculation would choose it there (its penalties counting
those tokens, its grammar's mask after them, min_new_tokens, and the same noise row of the request's
seeded stream). Drafts are accepted while each equals the token chosen before it; the first choice that
differs, or the one after the last draft, ends the step's tokens. So output is token for token what
`--speculate 0` gives, greedy or sampled with a seed: for sampling this is the rejection rule for a
deterministic draft (accepted with probability p(draft); on rejection a draw from p without it).
"""

from __future__ import annotations

import ctypes
import logging
import platform

import torch

from tgi_llm.engine.runner_protocol import SampledToken, SeqResult
from tgi_llm.engine.sampling import Sampler, samples
from tgi_llm.engine.step_plan import ScheduledSeq, StepPlan
from tgi_llm.kv_cache import KVCache
from tgi_llm.lora.registry import LoraLoad, LoraLoadError
from tgi_llm.lora.weights import LoraBatch
from tgi_llm.runner.batch_inputs import BatchInputs, flatten, num_sample_rows, to_metadata
from tgi_llm.runner.grammar_mask import GrammarMasker
from tgi_llm.runner.request_state import RequestStates
from tgi_llm.runner.sampled_rows import SampledRows

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit


def keep_freed_memory_in_heap() -> bool:
    """glibc hands large freed blocks straight back to the OS (munmap, heap trim), so every large activation
    of the next forward page-faults fresh zeroed pages: ~20% of a CPU prefill. Serve blocks up to 32 MiB
    from the heap and keep freed memory there (bounded by the forward's peak working set). Process-wide."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) and mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    return bool(ok)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: KVCache, block_size: int, vocab_size: int,
                 device: torch.device, eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.states = RequestStates(vocab_size, device)
        self.eos_token_ids = frozenset(t for t in eos_token_ids if 0 <= t < vocab_size)
        self.grammar = GrammarMasker(vocab_size, self.eos_token_ids)
        if device.type == "cpu" and keep_freed_memory_in_heap():
            logger.info("glibc malloc: large blocks kept in the heap (no page faults per forward)")

    def forward_plan(self, plan: StepPlan) -> tuple[BatchInputs, torch.Tensor]:
        """The forward every rank runs: the flat batch, and logits [len(logits_indices), V] (float32)."""
        self._load_adapters(plan.lora_loads)
        batch = flatten(plan, self.block_size)
        dev = self.device
        attn = to_metadata(batch, self.block_size, dev)
        input_ids = torch.tensor(batch.input_ids, dtype=torch.long, device=dev)
        positions = torch.tensor(batch.positions, dtype=torch.long, device=dev)
        lora = LoraBatch.of(batch.lora_slots)
        hidden = self.model(input_ids, positions, self.kv_caches, attn, lora) if lora is not None \
            else self.model(input_ids, positions, self.kv_caches, attn)
        if not batch.logits_indices:  # only prompt chunks that sample nothing: no LM head (on every rank)
            return batch, hidden.new_empty((0, 0), dtype=torch.float32)
        rows = torch.tensor(batch.logits_indices, dtype=torch.long, device=dev)
        return batch, self.model.compute_logits(hidden.index_select(0, rows))

    def _load_adapters(self, loads: list[LoraLoad]) -> None:
        """Read each adapter into its slot. A failure names the slot (the engine frees it) and fails the step."""
        for load in loads:
            try:
                self.model.lora.load(load.slot, load.path)
            except Exception as exc:
                raise LoraLoadError(load.slot, f"LoRA adapter {load.path} failed to load: {exc}") from exc

    @torch.inference_mode()
    def warm_up(self) -> None:
        """A one-block prompt, a decode step and a decode verifying two draft tokens through the model, in
        blocks 0 and 1 of the still empty KV cache, before the first request. What the first forward of each
        kind builds or checks (the fused layer stack, and its comparison with the torch layers, which runs
        the step twice) then costs 20 tokens at start-up instead of a user's first prompt: a first 512-token
        chunk paid ~0.7 s for it at float32, and a first verify step measured that slow would tell
        speculation (policy.py) that guessing never pays. Nothing stays: no request holds those blocks and
        no prefix hash names them. Single-shard only (a shard group's ranks run only the plans rank 0 sends
        them)."""
        n = self.block_size
        if not self.kv_caches or self.kv_caches[0][0].shape[0] < 2:
            return
        for entry in (ScheduledSeq(0, 0, list(range(n)), [0], samples=True),
                      ScheduledSeq(0, n, [n], [0, 1], samples=True, is_decode=True),
                      ScheduledSeq(0, n + 1, [n + 1, n + 2, n + 3], [0, 1], samples=True, is_decode=True,
                                   num_drafts=2)):
            self.forward_plan(StepPlan([entry]))

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> list[SeqResult | None]:
        for request_id in plan.released:
            self.states.release(request_id)
        batch, logits = self.forward_plan(plan)
        results: list[SeqResult | None] = [None] * len(plan.seqs)
        if batch.sample_seqs:
            self._sample(plan, batch.sample_seqs, logits[: num_sample_rows(plan, batch)], results)
        for i, offset, rows in batch.prompt_logprob_rows:
            entry = plan.seqs[i]
            targets = entry.request.input_ids[entry.start + 1 : entry.start + 1 + rows]
            lps, top = _prompt_logprobs(logits[offset : offset + rows], targets, entry.request.top_n_tokens)
            if results[i] is None:
                results[i] = SeqResult()
            results[i].prompt_logprobs, results[i].prompt_top = lps, top
        return results

    def _sample(self, plan: StepPlan, seq_indices: list[int], logits: torch.Tensor,
                results: list[SeqResult | None]) -> None:
        """`logits` holds each sampling sequence's 1 + num_drafts rows, in the order of `seq_indices`."""
        entries = [plan.seqs[i] for i in seq_indices]
        states = [self.states.get(e.request_id, e.request) for e in entries]
        # The drafts each sequence can verify: its grammar may end them early.
        rows = SampledRows.of(entries, [self.grammar.valid_drafts(st.matcher, e.drafts) if st.matcher is not None
                                        else e.drafts for e, st in zip(entries, states, strict=True)])
        if rows.num_rows != logits.shape[0]:
            logits = logits.index_select(0, torch.tensor(rows.logits_rows, dtype=torch.long, device=logits.device))
        self._hold_eos(logits, entries, states, rows)
        constrained = [j for j, s in enumerate(states) if s.matcher is not None]
        if constrained:
            self.grammar.mask(logits, [rows.firsts[j] for j in constrained],
                              [states[j].matcher for j in constrained], [rows.drafts[j] for j in constrained])
        params = [states[j].request.sampling for j in rows.owner]
        top_n = max(s.request.top_n_tokens for s in states)
        noise = self._take_noise(states, rows.drafts, logits.shape[1])
        out = self.sampler(logits, params, [states[j].generator for j in rows.owner],
                           self._row_counts(entries, rows), top_n, [row for per_seq in noise for row in per_seq])
        chosen = rows.kept(out.next_token_ids.tolist())  # one host transfer for the whole batch
        for state, noise_rows, kept in zip(states, noise, chosen, strict=True):
            if noise_rows[0] is not None:  # rows past the first rejection: the next step's first tokens
                state.give_back_noise(noise_rows[len(kept):])
        self._record_penalties(entries, chosen)
        outcomes = self.grammar.advance([states[j].matcher for j in constrained], [chosen[j] for j in constrained]) \
            if constrained else []
        outcome = dict(zip(constrained, outcomes, strict=True))
        lps = out.logprobs.tolist()
        top_ids = out.top_token_ids.tolist() if out.top_token_ids is not None else None
        top_lps = out.top_logprobs.tolist() if out.top_logprobs is not None else None
        for j, (i, state) in enumerate(zip(seq_indices, states, strict=True)):
            n = state.request.top_n_tokens
            tokens = [SampledToken(token, lps[row], top_ids[row][:n] if top_ids and n else [],
                                   top_lps[row][:n] if top_lps and n else [])
                      for row, token in enumerate(chosen[j], start=rows.firsts[j])]
            results[i] = SeqResult(
                tokens=tokens, grammar_done=outcome.get(j) is True,
                error=outcome[j] if isinstance(outcome.get(j), str) else None, num_drafts=len(rows.drafts[j]),
            )

    def _take_noise(self, states: list, drafts: list[list[int]], width: int) -> list[list[torch.Tensor | None]]:
        """Per sequence, the noise of each of its rows: the row of the token it chooses in its request's
        seeded stream (None for rows that do not sample)."""
        return [state.take_noise(1 + len(d), width, self.device)
                if state.generator is not None and samples(state.request.sampling) else [None] * (1 + len(d))
                for state, d in zip(states, drafts, strict=True)]

    def _row_counts(self, entries: list[ScheduledSeq], rows: SampledRows) -> list[torch.Tensor | None] | None:
        """Each row's penalty counts: its request's, plus the draft tokens before the row."""
        penalties = self.states.penalties
        if not len(penalties):
            return None
        counts = penalties.counts([e.request_id for e in entries])
        out: list[torch.Tensor | None] = []
        for j, r in zip(rows.owner, rows.depth, strict=True):
            base = counts[j]
            if base is None or r == 0:
                out.append(base)
                continue
            row = base.clone()
            row.index_put_((torch.tensor(rows.drafts[j][:r], device=row.device),),
                           torch.ones(r, dtype=row.dtype, device=row.device), accumulate=True)
            out.append(row)
        return out

    def _record_penalties(self, entries: list[ScheduledSeq], chosen: list[list[int]]) -> None:
        penalties = self.states.penalties
        if not len(penalties):
            return
        keys = [e.request_id for e, tokens in zip(entries, chosen, strict=True) for _ in tokens]
        flat = [t for tokens in chosen for t in tokens]
        penalties.record(keys, torch.tensor(flat, dtype=torch.long, device=self.device))

    def _hold_eos(self, logits: torch.Tensor, entries: list[ScheduledSeq], states: list, rows: SampledRows) -> None:
        """Rows that have not generated their min_new_tokens yet cannot pick an end-of-sequence token."""
        early = [row for row, (j, r) in enumerate(zip(rows.owner, rows.depth, strict=True))
                 if entries[j].end - entries[j].num_drafts + r - states[j].request.input_length
                 < states[j].request.stopping.min_new_tokens]
        if early and self.eos_token_ids:
            rows = torch.tensor(early, device=logits.device)[:, None]
            cols = torch.tensor(sorted(self.eos_token_ids), device=logits.device)[None, :]
            logits[rows, cols] = float("-inf")

    def close(self) -> None:
        self.kv_caches = []
        release = getattr(self.model, "release_caches", None)  # a model that keeps references to them
        if release is not None:
            release()


def _prompt_logprobs(logits: torch.Tensor, targets: tuple[int, ...], top_n: int
                     ) -> tuple[list[float], list[tuple[list[int], list[float]]] | None]:
    """Each prompt token's logprob given its prefix, and with top_n the best alternatives at each row (from
    the same log_softmax, so a token that is the argmax has exactly the top logprob)."""
    index = torch.tensor(targets, dtype=torch.long, device=logits.device)
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, index[:, None]).squeeze(1).tolist()
    if not top_n:
        return chosen, None
    best = torch.topk(logprobs, min(top_n, logprobs.shape[-1]), dim=-1)
    return chosen, list(zip(best.indices.tolist(), best.values.tolist(), strict=True))
