"""A model runner stand-in: scripted tokens, no model. Lets the engine loop be tested on the CPU fast."""

from __future__ import annotations

import threading
import time

from tgi_llm.engine.runner_protocol import SampledToken, SeqResult
from tgi_llm.engine.step_plan import StepPlan


class FakeRunner:
    """Sequence i emits `script[k]` as its k-th token (cycling), unless its prompt starts with a key
    of `per_prompt`, whose list it follows instead. A prompt starting with `poison` fails the forward; one
    starting with `unfollowable` gets an error result (as a grammar that cannot be followed) at its 3rd token.
    A decode with draft tokens gets its scripted tokens too: the drafts that match them, then one more."""

    def __init__(self, script: list[int], per_prompt: dict[int, list[int]] | None = None,
                 poison: int | None = None, step_delay_s: float = 0.0, unfollowable: int | None = None) -> None:
        self.script = script
        self.per_prompt = per_prompt or {}
        self.poison = poison
        self.unfollowable = unfollowable
        self.step_delay_s = step_delay_s
        self.batches: list[list[int]] = []  # request ids of every forward, for batching assertions
        self.plans: list[StepPlan] = []
        self.released: set[int] = set()
        self.lock = threading.Lock()

    def execute(self, plan: StepPlan) -> list[SeqResult | None]:
        with self.lock:
            self.batches.append([s.request_id for s in plan.seqs])
            self.plans.append(plan)
            self.released.update(plan.released)
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if self.poison is not None and any(s.request.input_ids[0] == self.poison for s in plan.seqs):
            raise RuntimeError("poisoned batch")
        out: list[SeqResult | None] = []
        for entry in plan.seqs:
            request = entry.request
            rows = entry.num_tokens - (1 if entry.samples else 0)
            prompt_lps = [-1.0] * rows if entry.prompt_logprobs else None
            if not entry.samples:
                out.append(SeqResult(prompt_logprobs=prompt_lps) if prompt_lps else None)
                continue
            script = self.per_prompt.get(request.input_ids[0], self.script)
            index = entry.end - entry.num_drafts - request.input_length
            if request.input_ids[0] == self.unfollowable and index == 2:
                out.append(SeqResult([SampledToken(script[0])], error="the grammar cannot be followed: limit hit"))
                continue
            tokens = [script[index % len(script)]]
            for draft in entry.drafts:
                if draft != tokens[-1]:
                    break
                tokens.append(script[(index + len(tokens)) % len(script)])
            out.append(SeqResult([SampledToken(t, -0.5, [t], [-0.5]) for t in tokens], prompt_logprobs=prompt_lps,
                                 num_drafts=entry.num_drafts))
        return out

    def close(self) -> None:
        pass
