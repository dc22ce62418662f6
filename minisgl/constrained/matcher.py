"""A request's position in its grammar, and the batched masking of the logits rows that carry one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerBase

from minisgl.constrained.backend import xgrammar

if TYPE_CHECKING:
    import xgrammar as xgr

# Past this many rows the bitmask is filled by xgrammar's thread pool instead of row by row.
BATCH_FILL_MIN_ROWS = 4


class GrammarMatcher:
    """Accepts a request's tokens one at a time and says which tokens may come next. Terminated
    once a stop token is accepted where the grammar allows the output to end."""

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self.vocab_size: int = compiled.tokenizer_info.vocab_size
        self._matcher = xgrammar().GrammarMatcher(compiled)

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and unchanged) if the grammar does not allow it."""
        return bool(self._matcher.accept_token(token_id))

    def rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)

    @property
    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def jump_forward_string(self) -> str:
        """The text every continuation starts with (a schema's next key, punctuation); may be empty."""
        return str(self._matcher.find_jump_forward_string())

    def jump_forward(self, tokenizer: PreTrainedTokenizerBase, limit: int) -> list[int]:
        """Jump-forward decoding: the tokens of the text the grammar forces next (at most ``limit``),
        already accepted, so the caller appends them without sampling. Empty when nothing is forced."""
        text = self.jump_forward_string() if limit > 0 else ""
        if not text:
            return []
        tokens = tokenizer.encode(text, add_special_tokens=False)[:limit]
        for i, token in enumerate(tokens):
            if not self.accept(token):  # the forced text tokenized across a boundary the grammar rejects
                self.rollback(i)
                return []
        return tokens

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)


def mask_logits(logits: torch.Tensor, matchers: Sequence[GrammarMatcher | None]) -> None:
    """Set to -inf, in place, every token a row's grammar forbids next; rows without one are untouched.
    One bitmask for the batch, filled on the CPU (by a thread pool for many rows), applied in one call."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return
    xgr = xgrammar()
    vocab_size = next(m.vocab_size for m in matchers if m is not None)
    bitmask = xgr.allocate_token_bitmask(len(matchers), vocab_size)
    if len(rows) >= BATCH_FILL_MIN_ROWS:
        inner = [matchers[i]._matcher for i in rows]  # type: ignore[union-attr]
        xgr.BatchGrammarMatcher().batch_fill_next_token_bitmask(inner, bitmask, indices=rows)
    else:
        for i in rows:
            matchers[i].fill_bitmask(bitmask, i)  # type: ignore[union-attr]
    # Logits past the tokenizer's vocabulary (padding rows of the LM head) are never allowed.
    if logits.shape[-1] > vocab_size:
        logits[rows, vocab_size:] = float("-inf")
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=vocab_size, indices=rows)
