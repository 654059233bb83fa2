"""Chat messages to a prompt with the model's own chat template (tokenizer_config.json's `chat_template`)."""

from __future__ import annotations

from typing import Any

from tgi_llm.front.errors import FrontError
from tgi_llm.front.schemas import ChatMessage


def render_chat(tokenizer: Any, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt text, ending with the assistant turn's opening (add_generation_prompt), as TGI does."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise FrontError("Template error: this model has no chat template", "template_error")
    if not messages:
        raise FrontError("`messages` cannot be empty", "validation")
    try:
        return tokenizer.apply_chat_template(
            [m.for_template() for m in messages], tools=tools, tokenize=False, add_generation_prompt=True
        )
    except Exception as exc:  # jinja2's TemplateError, or the template's own raise_exception(...)
        raise FrontError(f"Template error: {exc}", "template_error") from exc
