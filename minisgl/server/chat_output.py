"""A chat response's choices: each sample's answer split into ``reasoning_content`` (a thinking model's
reasoning, where the server separates it), ``content`` and ``tool_calls`` (where the request offered tools),
whole or as streamed deltas (a call is sent in one ``delta.tool_calls`` chunk once it is complete)."""

from __future__ import annotations

import uuid
from typing import Any

from minisgl.constrained.tool_calls import Tool, ToolCall, ToolCallParser, parse_tool_calls
from minisgl.text.reasoning import ReasoningParser, split_reasoning


class ChatOutput:
    """The ``choice`` and ``chunk`` builders of one chat request. ``thinking``: None where reasoning is not
    separated (the server's ``--reasoning-parser none``, a model without the tags), else whether the prompt
    opened the reasoning block (``ThinkTags.opened_by``)."""

    def __init__(self, tools: list[Tool], thinking: bool | None) -> None:
        self.names = {t.name for t in tools}
        self.thinking = thinking
        self._reasoning: dict[int, ReasoningParser] = {}  # per choice index, while streaming
        self._calls: dict[int, ToolCallParser] = {}
        self._sent: dict[int, int] = {}  # calls streamed per choice index

    def choice(self, index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.thinking is not None:
            message["reasoning_content"], message["content"] = split_reasoning(text, self.thinking)
        calls: list[ToolCall] = []
        if self.names and message["content"] is not None:
            message["content"], calls = parse_tool_calls(message["content"], self.names)
        if calls:
            message["tool_calls"] = [_call_json(c) for c in calls]
        return {"index": index, "message": message, "finish_reason": _reason(finish_reason, calls), "logprobs": None}

    def chunk(self, index: int, text: str | None, finish_reason: str | None) -> dict[str, Any] | None:
        if text is None:  # the opening chunk that announces the role
            return {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "finish_reason": None,
                "logprobs": None,
            }
        reasoning, content = "", text
        if self.thinking is not None:
            parser = self._reasoning.setdefault(index, ReasoningParser(self.thinking))
            reasoning, content = parser.push(text)
            if finish_reason is not None:
                rest_reasoning, rest_content = parser.finish()
                reasoning, content = reasoning + rest_reasoning, content + rest_content
        calls: list[ToolCall] = []
        if self.names:
            call_parser = self._calls.setdefault(index, ToolCallParser(self.names))
            content, calls = call_parser.push(content)
            if finish_reason is not None:
                rest, last = call_parser.finish()
                content, calls = content + rest, calls + last
        delta: dict[str, Any] = {"reasoning_content": reasoning} if reasoning else {}
        if content:
            delta["content"] = content
        if calls:
            first = self._sent.get(index, 0)
            self._sent[index] = first + len(calls)
            delta["tool_calls"] = [{"index": first + i, **_call_json(c)} for i, c in enumerate(calls)]
        if not delta and finish_reason is None:
            return None
        reason = None
        if finish_reason is not None:
            reason = _reason(finish_reason, self._calls[index].calls if self.names else [])
        return {"index": index, "delta": delta, "finish_reason": reason, "logprobs": None}


def _call_json(call: ToolCall) -> dict[str, Any]:
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function}


def _reason(finish_reason: str | None, calls: list[ToolCall]) -> str | None:
    return "tool_calls" if calls and finish_reason == "stop" else finish_reason
