"""A choice's ``logprobs`` in OpenAI's two shapes, from the engine's ``TokenLogprob``s: the chat API's
``{"content": [{token, logprob, bytes, top_logprobs}]}`` and the completions API's parallel lists
(``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``). A streamed choice gets those of the
tokens its chunk carries."""

from __future__ import annotations

from typing import Any, Protocol

from minisgl.sampling import TokenLogprob
from minisgl.text.token_bytes import TokenBytes


class LogprobsFormat(Protocol):
    def __call__(self, index: int, token_ids: list[int], logprobs: list[TokenLogprob]) -> dict[str, Any]:
        """The ``logprobs`` of choice ``index`` for its next tokens ``token_ids``."""
        ...


class ChatLogprobs:
    def __init__(self, tokens: TokenBytes) -> None:
        self.tokens = tokens

    def __call__(self, index: int, token_ids: list[int], logprobs: list[TokenLogprob]) -> dict[str, Any]:
        content = []
        for token_id, lp in zip(token_ids, logprobs, strict=True):
            top = [self._entry(i, value) for i, value in lp.top]
            content.append({**self._entry(token_id, lp.logprob), "top_logprobs": top})
        return {"content": content}

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        spelled = self.tokens.bytes_of(token_id)
        return {"token": spelled.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(spelled)}


class CompletionLogprobs:
    """``top_logprobs`` holds the sampled token too, so up to k + 1 entries (as vLLM's); ``text_offset``
    counts each token's text, one after the other, from the start of the choice's text (on across a
    stream's chunks)."""

    def __init__(self, tokens: TokenBytes) -> None:
        self.tokens = tokens
        self._offsets: dict[int, int] = {}  # per choice: where its next token's text starts

    def __call__(self, index: int, token_ids: list[int], logprobs: list[TokenLogprob]) -> dict[str, Any]:
        offset = self._offsets.get(index, 0)
        texts, offsets, tops = [], [], []
        for token_id, lp in zip(token_ids, logprobs, strict=True):
            text = self.tokens.text_of(token_id)
            top = {self.tokens.text_of(i): value for i, value in lp.top}
            top.setdefault(text, lp.logprob)
            texts.append(text)
            offsets.append(offset)
            tops.append(top)
            offset += len(text)
        self._offsets[index] = offset
        return {"tokens": texts, "token_logprobs": [lp.logprob for lp in logprobs], "top_logprobs": tops,
                "text_offset": offsets}  # fmt: skip
