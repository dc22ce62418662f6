"""Incremental detokenization whose pieces add up to exactly the offline (non-streamed) text.

Two things are held back until they resolve:
- an incomplete UTF-8 character (byte-level tokens can split one; it decodes to U+FFFD), and
- text that could be the start of a stop string: it is released if the stop string does not
  follow, and cut (never emitted) if it does.
"""

from __future__ import annotations

from typing import cast

from transformers import PreTrainedTokenizerBase

from minisgl.sampling import cut_at_stop

_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str]) -> None:
        self.tokenizer, self.stop = tokenizer, stop
        self.ids: list[int] = []
        self.text = ""  # decoded text of ids[:read_offset]
        # Decoding a window that starts a few tokens back (prefix_offset) gives each new token the
        # context some tokenizers need to render its leading space, at O(window) cost per token.
        self._prefix_offset = 0
        self._read_offset = 0
        self.emitted = ""  # everything returned so far

    def push(self, token_id: int) -> str:
        """Add one token; returns the text that became final (possibly empty)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        window = self._decode(self.ids[self._prefix_offset :])
        if len(window) > len(prefix) and not window.endswith(_INCOMPLETE):
            self.text += window[len(prefix) :]
            self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        return self._release(self._visible(self.text, final=False))

    def finish(self) -> str:
        """The request ended: returns the rest, so that ``emitted`` equals the offline text."""
        full = self._visible(self._decode(self.ids), final=True)
        if full.startswith(self.emitted):
            return self._release(full)
        # Unreachable for tokenizers whose decoding is compositional (byte-level BPE, sentencepiece
        # with the prefix window); emit what is consistent with the stream rather than repeat text.
        return self._release(self._visible(self.text, final=True))

    def _release(self, visible: str) -> str:
        piece = visible[len(self.emitted) :]
        self.emitted += piece
        return piece

    def _visible(self, text: str, final: bool) -> str:
        if not self.stop:
            return text
        text = cut_at_stop(text, self.stop)
        if final:
            return text
        return text[: len(text) - self._stop_prefix_len(text)]

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is the beginning of some stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def _decode(self, ids: list[int]) -> str:
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=True))
