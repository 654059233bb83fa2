"""A thinking model's <think> part as `reasoning_content`: the splitter, and the chat route through the openai
SDK, streamed and not, over a fake Triton client whose tokenizer has the tags."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests.front.conftest import MODEL_ID, LiveServer, serve_in_thread
from tests.front.fake_client import FakeTritonClient
from tgi_llm.front.app import create_app
from tgi_llm.front.config import FrontConfig
from tgi_llm.front.reasoning import ReasoningSplitter, has_reasoning_tags

openai = pytest.importorskip("openai")

THOUGHT = ["<think>", "\n", "Add", " them", ".", "</", "think>", "\n\n", "It", " is", " 4", "."]
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def run(splitter: ReasoningSplitter, parts: list[str]) -> tuple[str, str]:
    reasoning = answer = ""
    for part in parts:
        r, a = splitter.feed(part)
        reasoning, answer = reasoning + r, answer + a
    r, a = splitter.finish()
    return reasoning + r, answer + a


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_the_split_does_not_depend_on_how_the_text_arrives(size):
    text = "<think>\nAdd them.</think>\n\nIt is 4."
    assert run(ReasoningSplitter.for_prompt("..."), pieces(text, size)) == ("Add them.", "It is 4.")


@pytest.mark.parametrize(("prompt", "text", "want"), [
    ("<|im_start|>assistant\n<think>\n", "Add them.</think>It is 4.", ("Add them.", "It is 4.")),  # opened for it
    ("...", "It is 4, not <think>.", (None, "It is 4, not <think>.")),  # no leading tag: all answer
    ("...", "<think>Still thinking when the length ran ou", ("Still thinking when the length ran ou", "")),
    ("...", "<thi", (None, "<thi")),  # a tag that never completed is text
    ("...", "  <think>a</think>b", ("a", "b")),
])
def test_whole_texts(prompt, text, want):
    assert ReasoningSplitter.for_prompt(prompt).split(text) == want


@pytest.fixture(scope="module")
def thinking_tokenizer(front_tokenizer: Any) -> Any:
    tokenizer = copy.deepcopy(front_tokenizer)
    tokenizer.add_tokens(["<think>", "</think>"], special_tokens=False)
    assert has_reasoning_tags(tokenizer) and not has_reasoning_tags(front_tokenizer)
    return tokenizer


def serve(tokenizer: Any, reasoning_format: str = "auto") -> Iterator[LiveServer]:
    fake = FakeTritonClient(script=THOUGHT)
    app = create_app(FrontConfig(model_id=MODEL_ID, reasoning_format=reasoning_format), fake, tokenizer)
    for url in serve_in_thread(app):
        yield LiveServer(url, fake)


@pytest.fixture
def thinking(thinking_tokenizer: Any) -> Iterator[LiveServer]:
    yield from serve(thinking_tokenizer)


def sdk(live: LiveServer) -> Any:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)


def test_the_thought_is_reasoning_content_streamed_or_not(thinking: LiveServer):
    client = sdk(thinking)
    message = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=20).choices[0].message
    assert message.content == "It is 4." and message.model_extra["reasoning_content"] == "Add them."
    chunks = list(client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=20, stream=True,
                                                 logprobs=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning == "Add them."
    assert "".join(d.content or "" for d in deltas) == "It is 4."
    tokens = [t.token for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert tokens == THOUGHT  # every token's logprob still arrives, with its reasoning or its answer delta


def test_a_thought_cut_by_the_length_limit_is_all_reasoning(thinking: LiveServer):
    message = sdk(thinking).chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=4).choices[0].message
    assert message.content == "" and message.model_extra["reasoning_content"] == "Add them"


def test_reasoning_format_none_and_models_without_tags_keep_it_inline(thinking_tokenizer, front_tokenizer):
    for tokenizer, reasoning_format in ((thinking_tokenizer, "none"), (front_tokenizer, "auto")):
        for live in serve(tokenizer, reasoning_format):
            message = sdk(live).chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=20).choices[0]
            assert message.message.content == "".join(THOUGHT)
            assert "reasoning_content" not in (message.message.model_extra or {})


def test_chat_template_kwargs_reach_the_template(thinking_tokenizer: Any):
    """Qwen3's and SmolLM3's `enable_thinking` is a template variable; reserved arguments are refused."""
    tokenizer = copy.deepcopy(thinking_tokenizer)
    tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                               "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")
    for live in serve(tokenizer):
        client = sdk(live)
        client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=1)
        assert live.fake.specs[-1].inputs == "What is 2 + 2?"
        client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=1,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert live.fake.specs[-1].inputs == "What is 2 + 2?<think></think>"
        with pytest.raises(openai.BadRequestError, match="`chat_template_kwargs` cannot set tokenize"):
            client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=1,
                                           extra_body={"chat_template_kwargs": {"tokenize": True}})
