"""The multi-turn workload: prompts carry the whole history with the answers actually given; turns of one
conversation run in order, conversations side by side up to the concurrency."""

from __future__ import annotations

import threading
import time

import pytest

from tgi_llm.bench.conversations import ConversationSpec, build_conversations, run_conversations, turn_prompt


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


class AnsweringClient:
    """Answers each turn with a text naming its request, after a short delay, on a thread."""

    name = "fake"

    def __init__(self, fail: set[int] | None = None) -> None:
        self.prompts: dict[int, str] = {}
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.fail = fail or set()

    def prepare(self, in_flight: int) -> None:
        pass

    def start(self, request, record, done) -> None:
        self.prompts[request.index] = request.prompt
        record.start = time.perf_counter()
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

        def answer() -> None:
            time.sleep(0.002)
            record.token_times = [time.perf_counter()] * request.output_len
            record.text = f"answer-{request.index}"
            if request.index in self.fail:
                record.error = "boom"
            record.end = time.perf_counter()
            with self.lock:
                self.in_flight -= 1
            done(record)

        threading.Thread(target=answer, daemon=True).start()

    def close(self, cancel: bool = False) -> None:
        pass


def test_conversations_share_the_system_prompt_and_differ_in_questions(tokenizer):
    spec = ConversationSpec(conversations=3, turns=2, system_tokens=120, question_tokens=20)
    convs = build_conversations(tokenizer, spec)
    assert len({c.system for c in convs}) == 1 and len({c.questions for c in convs}) == 3
    prompt = turn_prompt(tokenizer, convs[0], [])
    assert 130 <= len(tokenizer(prompt)["input_ids"]) <= 220  # system prompt + one question + the template


def test_each_turn_carries_the_answers_given_and_turns_run_in_order(tokenizer):
    spec = ConversationSpec(conversations=5, turns=3, system_tokens=30, question_tokens=8, answer_tokens=4)
    client = AnsweringClient()
    records, wall = run_conversations(client, tokenizer, build_conversations(tokenizer, spec), spec, concurrency=2,
                                      timeout_s=60, progress=False)
    assert [r.index for r in records] == list(range(15)) and all(r.ok for r in records) and wall > 0
    assert client.max_in_flight == 2  # one turn in flight per conversation, two conversations at once
    for c in range(5):
        for t in range(1, 3):
            prompt = client.prompts[c * 3 + t]
            assert all(f"answer-{c * 3 + k}" in prompt for k in range(t))
            assert records[c * 3 + t].start >= records[c * 3 + t - 1].end


def test_a_failed_turn_ends_its_conversation_and_the_rest_are_reported_not_sent(tokenizer):
    spec = ConversationSpec(conversations=2, turns=3, system_tokens=30, question_tokens=8, answer_tokens=2)
    records, _ = run_conversations(AnsweringClient(fail={1}), tokenizer, build_conversations(tokenizer, spec), spec,
                                   concurrency=2, timeout_s=60, progress=False)
    assert records[1].error == "boom" and records[2].error.startswith("not sent")
    assert all(r.ok for r in records[3:])
