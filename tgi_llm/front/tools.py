"""OpenAI tool calling on any model: the tools become a grammar the answer must follow, and the answer a
`tool_calls` message.

The model answers `{"name":"<function>","arguments":{...}}` (compact JSON, `name` first: the grammar
generates properties in schema order), one object per call, with the arguments constrained by the tool's
JSON Schema. With `tool_choice: "auto"` a `no_tool` function (TGI's) lets the model answer in text
instead: `{"name":"no_tool","arguments":{"content":"..."}}` comes back as a plain message. Templates
that know nothing of tools (the default model's) get the tool descriptions in the prompt, as TGI's
`tool_prompt` does.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from tgi_llm.front.errors import validation
from tgi_llm.front.response_format import check_json_schema

NO_TOOL = "no_tool"
NO_TOOL_SCHEMA = {"type": "object", "properties": {"content": {"type": "string", "description": "The answer"}},
                  "required": ["content"], "additionalProperties": False}
#: TGI's default tool prompt, with the answer format of this grammar.
DEFAULT_TOOL_PROMPT = ("Given the functions available, please respond with a JSON for a function call with its proper "
                       "arguments that best answers the given prompt. Respond in the format "
                       '{"name": function name, "arguments": dictionary of argument name and its value}. '
                       "Do not use variables.")
ARGUMENTS_PREFIX = ',"arguments":'


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools and tool_choice ask of the generation."""

    functions: list[Function]  # the ones the model may call (no_tool included for "auto")
    grammar: dict[str, Any]  # the `grammar` parameter for the model


def plan_tools(tools: list[dict[str, Any]] | None, tool_choice: Any) -> ToolPlan | None:
    """None when no tool may be called (no tools, or tool_choice "none")."""
    if tool_choice == "none" or (not tools and tool_choice in (None, "auto")):
        return None
    if not tools:  # as OpenAI and vLLM: a call demanded of no tools is refused, not served as plain text
        raise validation("`tool_choice` other than \"none\" or \"auto\" requires `tools`")
    functions = [_function(i, t) for i, t in enumerate(tools)]
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise validation("`tools` must have distinct function names")
    if tool_choice in (None, "auto"):
        chosen = [*functions, Function(NO_TOOL, "Answer in text when no function fits", NO_TOOL_SCHEMA)]
    elif tool_choice == "required":
        chosen = functions
    elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        wanted = function.get("name") if isinstance(function, dict) else None
        chosen = [f for f in functions if f.name == wanted]
        if not chosen:
            raise validation(f"`tool_choice.function.name` {wanted!r:.80} is not one of the tools: {', '.join(names)}")
    else:
        raise validation('`tool_choice` must be "none", "auto", "required" or {"type": "function", "function": '
                         '{"name": ...}}')
    options = [{"type": "object",
                "properties": {"name": {"const": f.name}, "arguments": f.parameters},
                "required": ["name", "arguments"], "additionalProperties": False} for f in chosen]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return ToolPlan(chosen, {"type": "json", "value": schema})


def _function(i: int, tool: Any) -> Function:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(
            tool.get("function"), dict):
        raise validation(f"`tools[{i}]` must be {{\"type\": \"function\", \"function\": {{...}}}}")
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not name or name == NO_TOOL:
        raise validation(f"`tools[{i}].function.name` must be a non-empty string other than {NO_TOOL}")
    parameters = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise validation(f"`tools[{i}].function.parameters` must be a JSON Schema object")
    check_json_schema(parameters, f"tools[{i}].function.parameters")
    return Function(name, str(fn.get("description") or ""), parameters)


def tool_prompt(plan: ToolPlan, prompt: str | None) -> str:
    """The text appended to the conversation for templates without tool support."""
    described = [{"name": f.name, "description": f.description, "parameters": f.parameters} for f in plan.functions]
    return f"{prompt or DEFAULT_TOOL_PROMPT}\n{json.dumps(described)}"


@dataclass(frozen=True)
class ToolAnswer:
    """The parsed answer: a call (name, arguments as a JSON string), or text (no_tool)."""

    name: str | None
    arguments: str | None
    content: str | None

    @property
    def is_call(self) -> bool:
        return self.name is not None


def parse_answer(text: str) -> ToolAnswer | None:
    """None when the text is not a complete answer (generation cut short by max_tokens or a stop)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or "arguments" not in value:
        return None
    if value["name"] == NO_TOOL:
        args = value["arguments"]
        return ToolAnswer(None, None, args.get("content", "") if isinstance(args, dict) else "")
    # Compact, as the grammar generated it (and as a stream sent it piece by piece).
    return ToolAnswer(value["name"], json.dumps(value["arguments"], ensure_ascii=False, separators=(",", ":")), None)


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallStream:
    """Turns the streamed answer into OpenAI's `delta.tool_calls` pieces as it arrives: the call's header
    once its name is complete, then the arguments' text as it is generated (the answer's closing brace,
    the last character, held back). A no_tool answer is text and comes out whole at the end.

    Per piece the work is bounded by the piece: the text is kept as parts (joined at the end), `,"arguments":`
    is looked for only where the new piece could complete it, and only the unsent arguments are held."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._length = 0  # characters fed so far
        self._tail = ""  # the last len(ARGUMENTS_PREFIX) - 1 characters, while the arguments are not found
        self._found = False  # `,"arguments":` was seen, and the header read
        self._unsent = ""  # a named call's arguments not sent yet: at least the last character, held back
        self.name: str | None = None
        self.id = call_id()

    @property
    def text(self) -> str:
        """The answer so far (joined on each call: read it at the end)."""
        return "".join(self._parts)

    def feed(self, delta: str) -> list[dict[str, Any]]:
        """tool_calls deltas to send for this piece of text (possibly none)."""
        self._parts.append(delta)
        self._length += len(delta)
        out = []
        if not self._found:
            window = self._tail + delta
            i = window.find(ARGUMENTS_PREFIX)
            if i < 0:
                self._tail = window[max(len(window) - len(ARGUMENTS_PREFIX) + 1, 0):]
                return []
            self._found, self._tail = True, ""
            start = self._length - len(window) + i  # where the prefix starts in the whole text
            head = self._header(self.text[:start])
            if head is None or head == NO_TOOL:
                return []  # text, or not a call this stream can follow: finish() sends what it is
            self.name = head
            out.append({"index": 0, "id": self.id, "type": "function", "function": {"name": head, "arguments": ""}})
            delta = window[i + len(ARGUMENTS_PREFIX):]  # the arguments' first characters (within this piece)
        elif self.name is None:
            return []
        self._unsent += delta
        if len(self._unsent) > 1:  # hold back the last character
            out.append({"index": 0, "function": {"arguments": self._unsent[:-1]}})
            self._unsent = self._unsent[-1:]
        return out

    def finish(self) -> tuple[list[dict[str, Any]], ToolAnswer | None]:
        """The rest of the arguments (without the closing brace) and the parsed answer."""
        answer = parse_answer(self.text)
        if answer is None or not answer.is_call:
            return [], answer
        if self.name is None:  # the header was never recognised while streaming: send the call whole
            return [{"index": 0, "id": self.id, "type": "function",
                     "function": {"name": answer.name, "arguments": answer.arguments}}], answer
        rest = self._unsent[:-1]
        return ([{"index": 0, "function": {"arguments": rest}}] if rest else []), answer

    @staticmethod
    def _header(head: str) -> str | None:
        """The function name in `{"name":"..."` (the text before `,"arguments":`)."""
        try:
            return json.loads(head + "}").get("name")
        except (json.JSONDecodeError, AttributeError):
            return None
