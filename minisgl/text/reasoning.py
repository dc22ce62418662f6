"""A thinking model's answer split into its reasoning and its content (OpenAI-compatible servers'
``reasoning_content``), whole or as it streams.

Thinking models (Qwen3, QwQ, DeepSeek-R1's distillations) write their reasoning between ``<think>`` and
``</think>``, each one token of their vocabulary. Where the reasoning starts depends on the chat template:
Qwen3's lets the model open it (the answer begins with ``<think>``), DeepSeek-R1's opens it in the prompt
(the answer begins inside it), and Qwen3's with ``enable_thinking: false`` writes an empty block into the
prompt (the answer is all content). So the parser starts from the prompt: inside the block where the
prompt's last tag opened one, else before it, where a ``<think>`` leading the answer opens it. Whitespace
around the reasoning and at the start of the content that follows it is dropped, as vLLM's and SGLang's
parsers and Qwen3's own template (when it renders earlier turns) drop it.
"""

from __future__ import annotations

from enum import Enum

from transformers import PreTrainedTokenizerBase

from minisgl.constrained.spec import ThinkTags
from minisgl.constrained.tool_calls import partial_tag_len

OPEN = "<think>"
CLOSE = "</think>"


def think_tags(tokenizer: PreTrainedTokenizerBase) -> ThinkTags | None:
    """The tokenizer's tags where both are single tokens that decode to themselves (the detokenizer skips
    special tokens: tags it would drop could not be found in the text); None for other models."""
    ids = []
    for tag in (OPEN, CLOSE):
        token = tokenizer.convert_tokens_to_ids(tag)
        if not isinstance(token, int) or token == tokenizer.unk_token_id:
            return None
        if tokenizer.decode([token], skip_special_tokens=True) != tag:
            return None
        ids.append(token)
    return ThinkTags(ids[0], ids[1])


class _Place(Enum):
    BEFORE = "before"  # the answer's start, where a leading <think> opens the reasoning
    THINKING_START = "thinking start"  # just inside <think>: whitespace dropped
    THINKING = "thinking"
    CONTENT_START = "content start"  # just after </think>: whitespace dropped
    CONTENT = "content"


class ReasoningParser:
    """Splits an answer incrementally: ``push`` takes text as it streams and returns the reasoning and
    the content that are final; ``finish`` releases what was held back. Held back: text that could still
    become ``<think>`` at the start, and inside the reasoning a tail that could become ``</think>`` or be
    whitespace before it. The whole text in one ``push`` then ``finish`` splits it the same way."""

    def __init__(self, opened: bool) -> None:
        self._place = _Place.THINKING_START if opened else _Place.BEFORE
        self._held = ""
        self.thought = opened  # whether the answer has a reasoning block

    def push(self, text: str) -> tuple[str, str]:
        held, self._held = self._held + text, ""
        reasoning = content = ""
        while held:
            if self._place is _Place.BEFORE:
                start = held.lstrip()
                if start.startswith(OPEN):
                    self._place, self.thought, held = _Place.THINKING_START, True, start[len(OPEN) :]
                elif OPEN.startswith(start):  # whitespace so far, or the tag's beginning
                    self._held = held
                    return reasoning, content
                else:
                    self._place = _Place.CONTENT
            elif self._place in (_Place.THINKING_START, _Place.CONTENT_START):
                held = held.lstrip()
                if held:
                    self._place = _Place.THINKING if self._place is _Place.THINKING_START else _Place.CONTENT
            elif self._place is _Place.THINKING:
                end = held.find(CLOSE)
                if end >= 0:
                    reasoning += held[:end].rstrip()
                    self._place, held = _Place.CONTENT_START, held[end + len(CLOSE) :]
                    continue
                body = held[: len(held) - partial_tag_len(held, CLOSE)]
                final = len(body.rstrip())
                reasoning, self._held = reasoning + held[:final], held[final:]
                return reasoning, content
            else:
                return reasoning, content + held
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """The answer ended: a held start that never became ``<think>`` is content; a held tail of the
        reasoning is reasoning, less its trailing whitespace."""
        held, self._held = self._held, ""
        if self._place is _Place.BEFORE:
            return "", held
        return held.rstrip(), ""


def split_reasoning(text: str, opened: bool) -> tuple[str | None, str | None]:
    """A whole answer's reasoning (None without a reasoning block or with an empty one) and content (None
    where a reasoning block leaves none: the answer ended thinking, or nothing followed the block)."""
    parser = ReasoningParser(opened)
    reasoning, content = parser.push(text)
    rest_reasoning, rest_content = parser.finish()
    reasoning, content = reasoning + rest_reasoning, content + rest_content
    if not parser.thought:
        return None, content
    return reasoning or None, content or None
