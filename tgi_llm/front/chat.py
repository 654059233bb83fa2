"""Chat messages to a prompt with the model's own chat template (tokenizer_config.json's `chat_template`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tgi_llm.front.errors import FrontError
from tgi_llm.front.schemas import ChatMessage

#: apply_chat_template's own arguments, which `chat_template_kwargs` may not set.
_RESERVED = {"conversation", "messages", "tools", "documents", "tokenize", "add_generation_prompt",
             "continue_final_message", "return_dict", "return_tensors", "chat_template", "padding", "truncation",
             "max_length", "tokenizer_kwargs"}


def render_chat(tokenizer: Any, messages: list[ChatMessage], tools: list[dict[str, Any]] | None,
                tool_text: str | None, bound: Callable[[str, int, str], None],
                template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text, ending with the assistant turn's opening (add_generation_prompt), as TGI does.
    `tools` go to templates that render them; for the others `tool_text` (the tool descriptions) is
    appended to the last message, as TGI does. `bound(field, characters, what)` refuses a prompt too long
    to serve: the messages' text before the template runs, then the prompt it renders. `template_kwargs`:
    the request's `chat_template_kwargs`, variables for the template (Qwen3's `enable_thinking`)."""
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if not template:
        raise FrontError("Template error: this model has no chat template", "template_error")
    if not messages:
        raise FrontError("`messages` cannot be empty", "validation")
    rendered = [m.for_template() for m in messages]
    if tools and "tools" not in str(template) and tool_text:
        rendered[-1] = {**rendered[-1], "content": f"{rendered[-1]['content']}\n---\n{tool_text}"}
        tools = None
    bound("messages", sum(len(m["content"]) for m in rendered), "characters of content")
    reserved = sorted(_RESERVED & set(template_kwargs or {}))
    if reserved:
        raise FrontError(f"`chat_template_kwargs` cannot set {', '.join(reserved)}", "validation")
    try:
        prompt = tokenizer.apply_chat_template(rendered, tools=tools, tokenize=False, add_generation_prompt=True,
                                               **(template_kwargs or {}))
    except Exception as exc:  # jinja2's TemplateError, or the template's own raise_exception(...)
        raise FrontError(f"Template error: {exc}", "template_error") from exc
    bound("messages", len(prompt), "characters once rendered with the chat template")
    return prompt
