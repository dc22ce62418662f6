"""Stop strings matched incrementally: each piece of new text is searched together with at most
the longest stop string's length of held-back text, so the cost per piece does not grow with the
length of the output."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Releases text that can no longer be part of a stop string and cuts at the first one.

    Text that could be the beginning of a stop string is held back until the next piece decides
    it; once a stop string is found the text before it is released and nothing after it ever is.
    The cut is at the first stop string to complete (a stream cannot wait for a longer one that
    began earlier), the earliest-starting one among those completed by the same piece."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(stop)
        self._max_held = max((len(s) for s in self.stop), default=1) - 1
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Add new text; returns the part of it (and of the held-back text) that became final."""
        if self.stopped:
            return ""
        # A stop string completed by ``piece`` starts inside the held-back tail: the held text is
        # the longest tail that begins some stop string, so the search window is bounded.
        text = self._held + piece
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return text[:cut]
        hold = self._partial_len(text)
        self._held = text[len(text) - hold :]
        return text[: len(text) - hold]

    def flush(self) -> str:
        """The text ended: held-back text that never became a stop string is final."""
        held, self._held = self._held, ""
        return held

    def _partial_len(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is the beginning of some stop string."""
        for n in range(min(self._max_held, len(text)), 0, -1):
            tail = text[len(text) - n :]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """The text before the first stop string, as a stream of the same text would end."""
    matcher = StopMatcher(stop)
    return matcher.feed(text) + matcher.flush()
