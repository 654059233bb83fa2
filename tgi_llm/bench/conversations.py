"""The multi-turn chat workload: conversations that share one long system prompt, each turn's prompt being
the whole history (system prompt, every earlier question and the answer the server actually gave) plus a
new question, rendered with the model's chat template. What a prefix cache is for: with it, a turn only
computes its new tokens.

Turns of one conversation run one after another (a turn needs the previous answer); `concurrency`
conversations run at once, the next one starting when one ends. Bounded in time like `run_load`.
"""

from __future__ import annotations

import queue
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

from tgi_llm.bench.clients import StreamClient
from tgi_llm.bench.stats import RequestRecord, wall_time
from tgi_llm.bench.workload import CORPUS, BenchRequest, make_prompt


@dataclass(frozen=True)
class ConversationSpec:
    conversations: int = 16
    turns: int = 5
    system_tokens: int = 500
    question_tokens: int = 40
    answer_tokens: int = 64  # generated per turn (exactly, with ignore_eos)
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.conversations, self.turns, self.system_tokens, self.question_tokens, self.answer_tokens) < 1:
            raise ValueError("conversations, turns and every length must be >= 1")

    @property
    def num_requests(self) -> int:
        return self.conversations * self.turns


@dataclass(frozen=True)
class Conversation:
    index: int
    system: str
    questions: tuple[str, ...]


def build_conversations(tokenizer: Any, spec: ConversationSpec) -> list[Conversation]:
    rng = random.Random(spec.seed)
    corpus = list(tokenizer(CORPUS, add_special_tokens=False)["input_ids"])
    system, _ = make_prompt(tokenizer, corpus, spec.system_tokens, 0)
    system = "You are a helpful assistant. Use the following notes when you answer. " + system
    out = []
    for c in range(spec.conversations):
        questions = []
        for _ in range(spec.turns):
            excerpt, _ = make_prompt(tokenizer, corpus, spec.question_tokens, rng.randrange(len(corpus)))
            questions.append(f"Tell me more about this: {excerpt}")
        out.append(Conversation(c, system, tuple(questions)))
    return out


def turn_prompt(tokenizer: Any, conversation: Conversation, answers: list[str]) -> str:
    """The prompt of turn len(answers): the history with the answers given so far, then the next question."""
    messages = [{"role": "system", "content": conversation.system}]
    for question, answer in zip(conversation.questions, answers, strict=False):
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": conversation.questions[len(answers)]})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def run_conversations(client: StreamClient, tokenizer: Any, conversations: list[Conversation], spec: ConversationSpec,
                      concurrency: int, timeout_s: float, progress: bool = True,
                      desc: str = "") -> tuple[list[RequestRecord], float]:
    """Every turn of every conversation; records indexed conversation * turns + turn (request order)."""
    from tqdm import tqdm

    turns = spec.turns
    records: list[RequestRecord | None] = [None] * spec.num_requests
    answers: dict[int, list[str]] = {c.index: [] for c in conversations}
    finished: queue.SimpleQueue[RequestRecord] = queue.SimpleQueue()
    bar = tqdm(total=spec.num_requests, desc=desc or client.name, file=sys.stderr, disable=not progress,
               unit="turn", leave=False)

    def start(conversation: Conversation) -> None:
        index = conversation.index * turns + len(answers[conversation.index])
        prompt = turn_prompt(tokenizer, conversation, answers[conversation.index])
        ids = tuple(tokenizer(prompt, add_special_tokens=True)["input_ids"])
        request = BenchRequest(index, prompt, ids, spec.answer_tokens)
        records[index] = RequestRecord(index, len(ids), spec.answer_tokens)
        client.start(request, records[index], finished.put)

    client.prepare(min(concurrency, len(conversations)))
    pending = list(conversations)
    deadline = time.perf_counter() + timeout_s
    in_flight = 0
    timed_out = False
    try:
        while pending or in_flight:
            while pending and in_flight < concurrency:
                start(pending.pop(0))
                in_flight += 1
            wait = deadline - time.perf_counter()
            if wait <= 0:
                timed_out = True
                break
            try:
                record = finished.get(timeout=wait)
            except queue.Empty:
                continue
            bar.update(1)
            conversation = conversations[record.index // turns]
            answers[conversation.index].append(record.text)
            if record.ok and len(answers[conversation.index]) < turns:
                start(conversation)  # its next turn, right away
            else:
                in_flight -= 1
    finally:
        bar.close()
        if timed_out:
            client.close(cancel=True)
    out = []
    for i, record in enumerate(records):
        if record is None:
            record = RequestRecord(i, 0, spec.answer_tokens, error="not sent (an earlier turn failed or time ran out)")
        elif record.end is None and record.error is None:
            record.error = f"not finished within {timeout_s:g} s"
        out.append(record)
    return out, wall_time(out)
