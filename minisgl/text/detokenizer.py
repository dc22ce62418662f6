"""Incremental detokenization whose pieces add up to exactly the offline (non-streamed) text.

Two things are held back until they resolve:
- an incomplete UTF-8 character (byte-level tokens can split one; it decodes to U+FFFD), and
- text that could be the start of a stop string (``StopMatcher``): it is released if the stop
  string does not follow, and cut (never emitted) if it does.

The scheduler runs one per request with stop strings (to finish it), the front ends one per
stream, and ``detokenize`` one over a finished request: all three see the same cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from transformers import PreTrainedTokenizerBase

from minisgl.text.stop import StopMatcher

_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self._matcher = StopMatcher(stop)
        self.ids: list[int] = []
        self.text = ""  # decoded text of ids[:read_offset]
        # Decoding a window that starts a few tokens back (prefix_offset) gives each new token the
        # context some tokenizers need to render its leading space, at O(window) cost per token.
        self._prefix_offset = 0
        self._read_offset = 0
        self.emitted = ""  # everything returned so far

    @property
    def stopped(self) -> bool:
        """A stop string has appeared: nothing after it is ever emitted."""
        return self._matcher.stopped

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens, one or as many as came together; returns the text that became final (possibly
        empty). Tokens pushed together cost one window's decoding between them."""
        self.ids.extend(token_ids)
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        window = self._decode(self.ids[self._prefix_offset :])
        new = ""
        if len(window) > len(prefix) and not window.endswith(_INCOMPLETE):
            new = window[len(prefix) :]
            self.text += new
            self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        return self._release(self._matcher.feed(new))

    def finish(self) -> str:
        """The request ended: returns the rest, so that ``emitted`` equals the offline text."""
        full = self._decode(self.ids)
        # Always true for tokenizers whose decoding is compositional (byte-level BPE, sentencepiece
        # with the prefix window); otherwise end on what is consistent with the stream.
        rest = full[len(self.text) :] if full.startswith(self.text) else ""
        return self._release(self._matcher.feed(rest) + self._matcher.flush())

    def _release(self, piece: str) -> str:
        self.emitted += piece
        return piece

    def _decode(self, ids: list[int]) -> str:
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=True))


def detokenize(tokenizer: PreTrainedTokenizerBase, ids: list[int], stop: Sequence[str]) -> str:
    """The final text of a request's output ids: exactly what a stream of the same ids emits, however
    they came in (tests/test_detokenizer.py), so they are pushed at once."""
    detok = IncrementalDetokenizer(tokenizer, stop)
    detok.push(ids)
    detok.finish()
    return detok.emitted
