"""Chat templating: the one place a conversation becomes prompt token ids (offline API, chat
shell and the OpenAI server render identically, so their greedy results match)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase


def render_chat(tokenizer: PreTrainedTokenizerBase, conversation: Sequence[Mapping[str, str]]) -> list[int]:
    """The conversation under the model's chat template with the assistant's turn opened.
    Raises ``ValueError`` if it is empty or the template rejects it (e.g. an order of roles)."""
    if not conversation:
        raise ValueError("conversation has no messages")
    try:
        text = tokenizer.apply_chat_template([dict(m) for m in conversation], tokenize=False, add_generation_prompt=True)
    except (TemplateError, ValueError) as e:
        raise ValueError(f"the chat template rejected the messages: {e}") from None
    # The template already wrote the special tokens it wants (BOS and the like).
    return tokenizer.encode(text, add_special_tokens=False)
