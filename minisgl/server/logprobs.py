"""A choice's ``logprobs`` in OpenAI's two shapes, from the engine's ``TokenLogprob``s: the chat API's
``{"content": [{token, logprob, bytes, top_logprobs}]}`` and the completions API's parallel lists
(``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``). A streamed choice gets those of the
tokens its chunk carries. A completion that echoes its prompt lists the prompt's tokens first, the first
of them with no log-probability (null): nothing predicts it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from minisgl.sampling import TokenLogprob
from minisgl.text.token_bytes import TokenBytes


class LogprobsFormat(Protocol):
    def __call__(self, index: int, token_ids: list[int], logprobs: Sequence[TokenLogprob | None]) -> dict[str, Any]:
        """The ``logprobs`` of choice ``index`` for its next tokens ``token_ids`` (None: a token nothing predicts)."""
        ...


class ChatLogprobs:
    def __init__(self, tokens: TokenBytes) -> None:
        self.tokens = tokens

    def __call__(self, index: int, token_ids: list[int], logprobs: Sequence[TokenLogprob | None]) -> dict[str, Any]:
        content = []
        for token_id, lp in zip(token_ids, logprobs, strict=True):
            assert lp is not None, "a chat response lists output tokens only, each predicted"
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

    def __call__(self, index: int, token_ids: list[int], logprobs: Sequence[TokenLogprob | None]) -> dict[str, Any]:
        offset = self._offsets.get(index, 0)
        texts: list[str] = []
        offsets: list[int] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        for token_id, lp in zip(token_ids, logprobs, strict=True):
            text = self.tokens.text_of(token_id)
            texts.append(text)
            offsets.append(offset)
            offset += len(text)
            if lp is None:
                values.append(None)
                tops.append(None)
                continue
            top = {self.tokens.text_of(i): value for i, value in lp.top}
            top.setdefault(text, lp.logprob)
            values.append(lp.logprob)
            tops.append(top)
        self._offsets[index] = offset
        return {"tokens": texts, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
