"""Chat templating: the one place a conversation becomes prompt token ids (offline API, chat
shell and the OpenAI server render identically, so their greedy results match)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from minisgl.constrained.tool_calls import Tool, prepare_conversation, template_takes_tools


def render_chat(
    tokenizer: PreTrainedTokenizerBase, conversation: Sequence[Mapping[str, Any]], tools: Sequence[Tool] = ()
) -> list[int]:
    """The conversation under the model's chat template with the assistant's turn opened; ``tools``,
    assistant ``tool_calls`` and ``tool`` results as ``prepare_conversation`` renders them.
    Raises ``ValueError`` if it is empty or the template rejects it (e.g. an order of roles)."""
    if not conversation:
        raise ValueError("conversation has no messages")
    try:
        messages, template_args = prepare_conversation(
            [dict(m) for m in conversation], list(tools), template_takes_tools(tokenizer.chat_template)
        )
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_args)
    except (TemplateError, ValueError) as e:
        raise ValueError(f"the chat template rejected the messages: {e}") from None
    # The template already wrote the special tokens it wants (BOS and the like).
    return tokenizer.encode(text, add_special_tokens=False)
