"""Tool calling: the tools a request offers, how they reach the prompt, how calls are read back out of
the output, and the grammar that forces a call when ``tool_choice`` demands one.

Calls use the Hermes / Qwen format, which many instruct models are trained on:
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``. A chat template that takes ``tools``
renders them itself; for one that does not (SmolLM2's), ``DEFAULT_TOOLS_PROMPT`` lists the tools in
the system message, assistant ``tool_calls`` are rendered in the call format and ``tool`` results
as ``<tool_response>`` blocks in a user turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from minisgl.constrained.backend import error_message, xgrammar

CALL_START, CALL_END = "<tool_call>", "</tool_call>"

DEFAULT_TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object

    def as_openai(self) -> dict[str, Any]:
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's form)


def parse_tools(tools: list[Any]) -> list[Tool]:
    """OpenAI's ``tools`` checked; ``ValueError`` naming the first malformed entry."""
    parsed: list[Tool] = []
    for i, entry in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(entry, dict) or entry.get("type") != "function" or not isinstance(entry.get("function"), dict):
            raise ValueError(f'{where} must be {{"type": "function", "function": {{...}}}}')
        function = entry["function"]
        name = function.get("name")
        if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-." for c in name):
            raise ValueError(f"{where}.function.name must be a non-empty name of letters, digits, _ - or ., got {name!r}")
        if any(t.name == name for t in parsed):
            raise ValueError(f"{where}.function.name {name!r} is used by an earlier tool")
        description = function.get("description", "")
        if not isinstance(description, str):
            raise ValueError(f"{where}.function.description must be a string")  # noqa: TRY004
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise ValueError(f'{where}.function.parameters must be a JSON schema of an object ({{"type": "object", ...}})')
        parsed.append(Tool(name, description, parameters))
    return parsed


def tool_choice_name(tool_choice: str | dict[str, Any] | None, tools: list[Tool]) -> str | None:
    """``tool_choice`` as "auto" | "none" | "required" | the name of the function it forces."""
    if tool_choice is None:
        return "auto" if tools else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "none", "required"):
            raise ValueError(f'tool_choice must be "auto", "none", "required" or a function, got {tool_choice!r}')
        if tool_choice == "required" and not tools:
            raise ValueError('tool_choice "required" needs tools')
        return tool_choice
    function = tool_choice.get("function") if tool_choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ValueError('tool_choice must be {"type": "function", "function": {"name": ...}}')  # noqa: TRY004
    if all(t.name != name for t in tools):
        raise ValueError(f"tool_choice names function {name!r}, which is not among the tools")
    return name


def forced_call_grammar(tools: list[Tool], choice: str) -> str | None:
    """EBNF for one call whose arguments match the function's parameters schema, when ``choice`` is
    "required" (any of the tools) or a function's name; None for "auto" and "none" (free text)."""
    if choice in ("auto", "none"):
        return None
    xgr = xgrammar()
    candidates = [t for t in tools if choice == "required" or t.name == choice]
    calls = []
    for tool in candidates:
        schema = {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
            "required": ["name", "arguments"],
        }
        try:
            calls.append(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False))
        except RuntimeError as e:
            raise ValueError(f"tool {tool.name!r} has invalid parameters: {error_message(e)}") from None
    body = calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls)
    start = xgr.Grammar.from_ebnf(f"root ::= {json.dumps(CALL_START + chr(10))}")
    end = xgr.Grammar.from_ebnf(f"root ::= {json.dumps(chr(10) + CALL_END)}")
    return str(xgr.Grammar.concat(start, body, end))


# -- the prompt --------------------------------------------------------------------------------
def template_takes_tools(chat_template: str | None) -> bool:
    return chat_template is not None and "tools" in chat_template


def prepare_conversation(
    messages: list[dict[str, Any]], tools: list[Tool], template_tools: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Messages (OpenAI's shape, with ``tool_calls`` and ``tool`` roles) made ready for the chat
    template, and the extra arguments to give it. ``template_tools``: the template renders tools."""
    if template_tools:
        converted = [_for_tool_template(m) for m in messages]
        return converted, ({"tools": [t.as_openai() for t in tools]} if tools else {})
    converted = [_for_plain_template(m) for m in messages]
    if tools:
        listing = DEFAULT_TOOLS_PROMPT.format(tools="\n".join(json.dumps(t.as_openai()) for t in tools))
        if converted and converted[0]["role"] == "system":
            converted[0] = {"role": "system", "content": f"{converted[0]['content']}\n\n{listing}"}
        else:
            converted.insert(0, {"role": "system", "content": listing})
    return converted, {}


def _call_text(call: dict[str, Any]) -> str:
    function = call.get("function", {})
    arguments = _arguments_object(function.get("arguments", "{}"))
    return f"{CALL_START}\n{json.dumps({'name': function.get('name'), 'arguments': arguments})}\n{CALL_END}"


def _arguments_object(arguments: Any) -> Any:
    """OpenAI sends arguments as JSON text; templates and the call format want the object."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            raise ValueError(f"tool call arguments must be a JSON object, got {arguments!r}") from None
    return arguments


def _for_tool_template(message: dict[str, Any]) -> dict[str, Any]:
    if not message.get("tool_calls"):
        return message
    calls = [
        {**c, "function": {**c["function"], "arguments": _arguments_object(c["function"].get("arguments", "{}"))}}
        for c in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}


def _for_plain_template(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content") or ""
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    if message.get("tool_calls"):
        calls = "\n".join(_call_text(c) for c in message["tool_calls"])
        content = f"{content}\n{calls}" if content else calls
    return {**_reasoning_of(message), "role": message["role"], "content": content}


def _reasoning_of(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn's ``reasoning_content``, kept for templates that render it (Qwen3's)."""
    return {"reasoning_content": message["reasoning_content"]} if "reasoning_content" in message else {}


# -- the output --------------------------------------------------------------------------------
class ToolCallParser:
    """Splits output text into content and tool calls, incrementally: ``push`` takes text as it
    streams and returns the content that is final and the calls completed so far; the whole text in
    one ``push`` then ``finish`` parses a non-streamed output the same way. Text that could still
    become ``<tool_call>`` is held back. A block whose JSON is not a call to a known tool is content."""

    def __init__(self, tool_names: set[str]) -> None:
        self.tool_names = tool_names
        self._buffer = ""  # unreleased text: a possible start tag, or an open block
        self.calls: list[ToolCall] = []

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buffer += text
        content, calls = "", []
        while True:
            start = self._buffer.find(CALL_START)
            if start < 0:
                keep = partial_tag_len(self._buffer, CALL_START)
                content += self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            end = self._buffer.find(CALL_END, start)
            if end < 0:
                content += self._buffer[:start]
                self._buffer = self._buffer[start:]
                break
            block = self._buffer[start : end + len(CALL_END)]
            call = self._parse(block[len(CALL_START) : -len(CALL_END)])
            content += self._buffer[:start] if call is not None else self._buffer[:start] + block
            if call is not None:
                calls.append(call)
            self._buffer = self._buffer[end + len(CALL_END) :]
        self.calls += calls
        return content, calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The output ended: an unterminated block still counts if its JSON is a whole call."""
        rest, self._buffer = self._buffer, ""
        if rest.startswith(CALL_START):
            call = self._parse(rest[len(CALL_START) :])
            if call is not None:
                self.calls.append(call)
                return "", [call]
        return rest, []

    def _parse(self, body: str) -> ToolCall | None:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in self.tool_names:
            return None
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if not isinstance(arguments, dict):
            return None
        return ToolCall(obj["name"], json.dumps(arguments))


def parse_tool_calls(text: str, tool_names: set[str]) -> tuple[str | None, list[ToolCall]]:
    """A whole output: its content and its calls. With calls, the content around them is stripped
    (None if only whitespace); without, it is the text unchanged."""
    parser = ToolCallParser(tool_names)
    content, _ = parser.push(text)
    rest, _ = parser.finish()
    content += rest
    if not parser.calls:
        return content, []
    return content.strip() or None, parser.calls


def partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
