"""Each token's own bytes and text, for responses that list the output token by token (log-probabilities).

A token can hold part of a character (byte-level BPE splits multi-byte characters; sentencepiece's byte
fallback writes one byte per token), so decoding it alone would lose bytes: they are read from the
vocabulary's own spelling of the token instead, and a token's text is its bytes decoded with U+FFFD for
an incomplete character (OpenAI's ``bytes`` and ``token`` fields).
"""

from __future__ import annotations

import re
from functools import cache

from transformers import PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import bytes_to_unicode

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # sentencepiece's byte fallback
_SPACE = "\u2581"  # sentencepiece's word boundary: a space


@cache
def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's spelling of bytes (GPT-2's, as transformers gives it), read back: character -> byte."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


class TokenBytes:
    """A tokenizer's tokens as bytes and text, each looked up once."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        # Its JSON: a ByteLevel decoder alone or within a Sequence.
        self._byte_level = decoder is not None and b'"type":"ByteLevel"' in decoder.__getstate__()
        self._added = set(tokenizer.added_tokens_decoder)  # spelled as they read, in every vocabulary
        self._bytes: dict[int, bytes] = {}

    def bytes_of(self, token_id: int) -> bytes:
        found = self._bytes.get(token_id)
        if found is None:
            found = self._bytes[token_id] = self._spell(token_id)
        return found

    def text_of(self, token_id: int) -> str:
        return self.bytes_of(token_id).decode("utf-8", errors="replace")

    def _spell(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):  # an id the vocabulary does not name
            return b""
        if self._byte_level and token_id not in self._added:
            alphabet = _byte_level_alphabet()
            if all(c in alphabet for c in piece):
                return bytes(alphabet[c] for c in piece)
        byte = _BYTE_PIECE.fullmatch(piece)
        if byte is not None:
            return bytes([int(byte.group(1), 16)])
        if _SPACE in piece:
            return piece.replace(_SPACE, " ").encode()
        return piece.encode()
