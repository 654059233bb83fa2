"""A model runner stand-in: scripted tokens, no model. Lets the engine loop be tested on the CPU fast."""

from __future__ import annotations

import threading
import time

from tgi_llm.engine.runner_protocol import SeqResult
from tgi_llm.engine.sequence import Sequence


class FakeRunner:
    """Sequence i emits `script[k]` as its k-th token (cycling), unless its prompt starts with a key
    of `per_prompt`, whose list it follows instead. A prompt starting with `poison` fails the forward."""

    def __init__(self, script: list[int], per_prompt: dict[int, list[int]] | None = None,
                 poison: int | None = None, step_delay_s: float = 0.0) -> None:
        self.script = script
        self.per_prompt = per_prompt or {}
        self.poison = poison
        self.step_delay_s = step_delay_s
        self.batches: list[list[int]] = []  # request ids of every forward, for batching assertions
        self.released: set[int] = set()
        self.lock = threading.Lock()

    def execute(self, batch: list[Sequence]) -> list[SeqResult]:
        with self.lock:
            self.batches.append([s.request_id for s in batch])
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if self.poison is not None and any(s.request.input_ids[0] == self.poison for s in batch):
            raise RuntimeError("poisoned batch")
        out = []
        for seq in batch:
            for s in batch:
                assert s.allocation is not None and s.allocation.capacity >= len(s.token_ids)
            script = self.per_prompt.get(seq.request.input_ids[0], self.script)
            token = script[seq.num_generated % len(script)]
            out.append(SeqResult(token_id=token, logprob=-0.5, top_ids=[token], top_logprobs=[-0.5],
                                 prompt_logprobs=[-1.0] * (seq.input_length - 1)
                                 if seq.is_prefill and seq.request.decoder_input_details else None))
        return out

    def release(self, request_id: int) -> None:
        self.released.add(request_id)

    def close(self) -> None:
        pass
