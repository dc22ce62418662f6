"""A request's position in its grammar, and the batched masking of the logits rows that carry one."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from minisgl.constrained.backend import xgrammar
from minisgl.constrained.spec import ThinkTags

if TYPE_CHECKING:
    import xgrammar as xgr


class GrammarMatcher:
    """Accepts a request's tokens one at a time and says which tokens may come next. Terminated
    once a stop token is accepted where the grammar allows the output to end. Used by one thread
    at a time."""

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self.vocab_size: int = compiled.tokenizer_info.vocab_size
        self._matcher = xgrammar().GrammarMatcher(compiled)
        self._next_mask: torch.Tensor | None = None  # the tokens allowed next, once filled

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and unchanged) if the grammar does not allow it."""
        accepted = bool(self._matcher.accept_token(token_id))
        if accepted:
            self._next_mask = None
        return accepted

    def rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)
        self._next_mask = None

    def advance(self, token_id: int, tokenizer: PreTrainedTokenizerBase, jump_limit: int) -> list[int]:
        """Everything a sampled token does to the grammar, in one call made off the scheduler loop:
        with a large grammar each step below can take 100 ms (xgrammar releases the GIL in all of
        them). Accept the token (``RuntimeError`` if the grammar rejects it), take the tokens it
        forces next (at most ``jump_limit``: jump-forward, see ``jump_forward``), and fill the mask
        of the token after them. Returns the forced tokens, already accepted."""
        if not self.accept(token_id):
            raise RuntimeError(f"sampled token {token_id} is outside the request's grammar")
        if self.is_terminated:
            return []
        forced = self.jump_forward(tokenizer, jump_limit)
        self.next_token_mask()
        return forced

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

    def next_token_mask(self) -> torch.Tensor:
        """[1, vocabulary words] bitmask of the tokens allowed next: filled by ``advance``, else now."""
        if self._next_mask is None:
            mask = xgrammar().allocate_token_bitmask(1, self.vocab_size)
            self.fill_bitmask(mask, 0)
            self._next_mask = mask
        return self._next_mask


class Grammar(Protocol):
    """What the scheduler and the sampler ask of a request's grammar."""

    vocab_size: int

    def advance(self, token_id: int, tokenizer: PreTrainedTokenizerBase, jump_limit: int) -> list[int]: ...

    @property
    def is_terminated(self) -> bool: ...

    def next_token_mask(self) -> torch.Tensor: ...


class _Stage(Enum):
    START = "start"  # the answer's first token: the grammar's, or <think> opening the reasoning
    THINKING = "thinking"  # inside the block: every token allowed
    ANSWER = "answer"  # after it: the grammar's tokens only


class GrammarAfterThought:
    """The grammar of a thinking model's answer (``SamplingParams.think_tags``): it holds once the reasoning
    block is closed, as vLLM and SGLang apply a grammar with a reasoning parser. Inside the block every token
    is allowed; the answer starts there where the prompt opened the block, else its first token is either
    the grammar's or ``<think>``, so a model that does not reason (or an instruct model whose vocabulary has
    the tags) is held to the grammar from its first token."""

    def __init__(self, grammar: GrammarMatcher, tags: ThinkTags, opened: bool) -> None:
        self.grammar, self.tags = grammar, tags
        self.vocab_size = grammar.vocab_size
        self._stage = _Stage.THINKING if opened else _Stage.START
        self._every_token = xgrammar().allocate_token_bitmask(1, self.vocab_size)  # every bit set; only read

    def advance(self, token_id: int, tokenizer: PreTrainedTokenizerBase, jump_limit: int) -> list[int]:
        """As ``GrammarMatcher.advance``; the token that closes the block starts the grammar, whose forced
        opening (a schema's ``{"``) may follow at once."""
        if self._stage is _Stage.ANSWER:
            return self.grammar.advance(token_id, tokenizer, jump_limit)
        if self._stage is _Stage.START:
            if token_id != self.tags.open_id:
                self._stage = _Stage.ANSWER
                return self.grammar.advance(token_id, tokenizer, jump_limit)
            self._stage = _Stage.THINKING
        elif token_id == self.tags.close_id:
            self._stage = _Stage.ANSWER
            forced = self.grammar.jump_forward(tokenizer, jump_limit)
            self.grammar.next_token_mask()
            return forced
        return []

    @property
    def is_terminated(self) -> bool:
        return self._stage is _Stage.ANSWER and self.grammar.is_terminated

    def next_token_mask(self) -> torch.Tensor:
        if self._stage is _Stage.THINKING:
            return self._every_token
        if self._stage is _Stage.ANSWER:
            return self.grammar.next_token_mask()
        mask = self.grammar.next_token_mask().clone()
        word, bit = divmod(self.tags.open_id, 32)
        mask[0, word] |= torch.tensor(1 << bit, dtype=torch.int64).to(torch.int32)  # bit 31: the sign bit
        return mask


def mask_logits(logits: torch.Tensor, matchers: Sequence[Grammar | None]) -> None:
    """Set to -inf, in place, every token a row's grammar forbids next; rows without one are untouched.
    One bitmask for the batch, from each row's mask (filled off the loop by ``advance``, or here on
    a request's first token), applied in one call."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return
    xgr = xgrammar()
    vocab_size = next(m.vocab_size for m in matchers if m is not None)
    bitmask = xgr.allocate_token_bitmask(len(matchers), vocab_size)
    for i in rows:
        bitmask[i] = matchers[i].next_token_mask()[0]  # type: ignore[union-attr]
    # Logits past the tokenizer's vocabulary (padding rows of the LM head) are never allowed.
    if logits.shape[-1] > vocab_size:
        logits[rows, vocab_size:] = float("-inf")
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=vocab_size, indices=rows)
