"""A chat response's tool calls: each sample's output split into ``content`` and ``tool_calls``,
whole or as streamed deltas (a call is sent in one ``delta.tool_calls`` chunk once it is complete)."""

from __future__ import annotations

import uuid
from typing import Any

from minisgl.constrained.tool_calls import Tool, ToolCall, ToolCallParser, parse_tool_calls


class ChatToolCalls:
    """The ``choice`` and ``chunk`` builders of a chat request that offered tools."""

    def __init__(self, tools: list[Tool]) -> None:
        self.names = {t.name for t in tools}
        self._parsers: dict[int, ToolCallParser] = {}  # per choice index, while streaming
        self._sent: dict[int, int] = {}  # calls streamed per choice index

    def choice(self, index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
        content, calls = parse_tool_calls(text, self.names)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [_call_json(c) for c in calls]
        return {"index": index, "message": message, "finish_reason": _reason(finish_reason, calls), "logprobs": None}

    def chunk(self, index: int, text: str | None, finish_reason: str | None) -> dict[str, Any] | None:
        if text is None:  # the opening chunk that announces the role
            return {"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None}
        parser = self._parsers.setdefault(index, ToolCallParser(self.names))
        content, calls = parser.push(text)
        if finish_reason is not None:
            rest, last = parser.finish()
            content, calls = content + rest, calls + last
        delta: dict[str, Any] = {"content": content} if content else {}
        if calls:
            first = self._sent.get(index, 0)
            self._sent[index] = first + len(calls)
            delta["tool_calls"] = [{"index": first + i, **_call_json(c)} for i, c in enumerate(calls)]
        if not delta and finish_reason is None:
            return None
        reason = _reason(finish_reason, parser.calls) if finish_reason is not None else None
        return {"index": index, "delta": delta, "finish_reason": reason, "logprobs": None}


def _call_json(call: ToolCall) -> dict[str, Any]:
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function}


def _reason(finish_reason: str | None, calls: list[ToolCall]) -> str | None:
    return "tool_calls" if calls and finish_reason == "stop" else finish_reason
