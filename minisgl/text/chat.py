"""Chat templating: the one place a conversation becomes prompt token ids (offline API, chat
shell and the OpenAI server render identically, so their greedy results match)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from minisgl.constrained.tool_calls import Tool, prepare_conversation, template_takes_tools


class TemplateVariableError(ValueError):
    """A template variable that names one of ``apply_chat_template``'s own arguments."""


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    conversation: Sequence[Mapping[str, Any]],
    tools: Sequence[Tool] = (),
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """The conversation under the model's chat template with the assistant's turn opened; ``tools``,
    assistant ``tool_calls`` and ``tool`` results as ``prepare_conversation`` renders them;
    ``template_kwargs``: more variables for the template (Qwen3's ``enable_thinking``, as vLLM's and
    SGLang's ``chat_template_kwargs``). Raises ``ValueError`` if the conversation is empty, a variable
    names one of ``apply_chat_template``'s own arguments, or the template rejects it (e.g. an order of roles)."""
    if not conversation:
        raise ValueError("conversation has no messages")
    variables = dict(template_kwargs or {})
    reserved = sorted(set(variables) & _own_arguments(tokenizer)) if variables else []
    if reserved:  # a client must not swap the template, its tokenization or its tools through them
        raise TemplateVariableError(f"chat template variables cannot set {', '.join(reserved)}")
    try:
        messages, template_args = prepare_conversation(
            [dict(m) for m in conversation], list(tools), template_takes_tools(tokenizer.chat_template)
        )
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **template_args, **variables
        )
    except (TemplateError, TypeError, ValueError) as e:  # TypeError: a variable of a type the template cannot use
        raise ValueError(f"the chat template rejected the messages: {e}") from None
    # The template already wrote the special tokens it wants (BOS and the like).
    return tokenizer.encode(text, add_special_tokens=False)


def _own_arguments(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """The named parameters of ``apply_chat_template`` and ``messages``, the conversation's name inside the
    template: its other keyword arguments reach the template as variables."""
    parameters = inspect.signature(tokenizer.apply_chat_template).parameters.values()
    return {"messages"} | {p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
