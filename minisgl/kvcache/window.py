"""The sliding-window layers' own KV slots.

A model whose layers attend only to the last ``window`` positions (Gemma 3's local layers, Mistral,
Qwen with ``use_sliding_window``) needs those layers' keys and values only for the last ``window - 1``
positions before each query. Those layers keep their KV in a second, smaller pool, indexed by window
slots; ``WindowSlots`` says which full slots (the page table's and the prefix cache's, one per token)
have their windowed layers' KV and in which window slot. A token out of every running request's
window gives its window slot back while its full slot stays: the prefix cache keeps the token, and a
cached prefix is reused only as far as the windowed layers' KV of its last ``window - 1`` tokens still
exists (``usable_len``), so a hit stays token-exact.

Window slot 0 is never handed out: a token whose windowed layers' KV is not kept writes it there
(``ABSENT``), and stale table entries read there under a zero attention weight.
"""

from __future__ import annotations

import math

import torch

ABSENT = 0  # the window slot of a token without windowed layers' KV: a scratch slot nothing reads


def slots_per_request(window: int, max_draft: int) -> int:
    """Window slots one request can hold at once: the ``window - 1`` keys before its next token, plus
    the new tokens of a pass that need a slot: the last ``window - 1`` of a prefill chunk (earlier
    ones are read fresh and never again), or every token of a decode pass (one, plus a draft)."""
    return window - 1 + max(window - 1, 1 + max_draft)


def sliding_window(layer_windows: tuple[int | None, ...], max_seq_len: int) -> int | None:
    """The window a model's windowed layers keep KV for (the widest, if they differ), or None when no
    layer's window is shorter than the context: then every layer keeps every token's KV."""
    windows = [w for w in layer_windows if w is not None]
    return max(windows) if windows and max(windows) < max_seq_len else None


def window_pool_slots(num_full_slots: int, ratio: float, min_slots: int) -> int:
    """Window slots beside ``num_full_slots`` full ones: ``ratio`` of them, at least what one request
    needs (``slots_per_request``), never more than one per full slot."""
    return min(num_full_slots, max(min_slots, math.ceil(ratio * num_full_slots)))


def full_slots_in_budget(budget: int, full_bytes: int, window_bytes: int, ratio: float, min_slots: int) -> int:
    """The most full slots whose KV (``full_bytes`` a token) and window pool (``window_pool_slots`` and
    the scratch slot, ``window_bytes`` each) fit in ``budget`` bytes."""

    def fits(n: int) -> bool:
        return n * full_bytes + (window_pool_slots(n, ratio, min_slots) + 1) * window_bytes <= budget

    # Every layer windowed (Mistral): the full slots cost nothing, so their count follows the ratio.
    low, high = 0, budget // full_bytes if full_bytes else math.ceil(budget / (ratio * window_bytes))
    while low < high:  # the largest n that fits: the pools grow with n
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


class WindowSlots:
    """The window slot of every full KV slot (``ABSENT``: none) and the free window slots."""

    def __init__(self, num_full_slots: int, num_window_slots: int, window: int) -> None:
        if window < 2:
            raise ValueError(f"a sliding window must span at least 2 positions, got {window}")
        self.window, self.capacity = window, num_window_slots
        self.slot_of = torch.full((num_full_slots,), ABSENT, dtype=torch.int64)
        self._free = torch.arange(1, num_window_slots + 1, dtype=torch.int64)

    @property
    def free_size(self) -> int:
        return len(self._free)

    def present(self, full_slots: torch.Tensor) -> torch.Tensor:
        """Which of ``full_slots`` have their windowed layers' KV."""
        return self.slot_of[full_slots] != ABSENT

    def assign(self, full_slots: torch.Tensor) -> None:
        """A window slot for each of ``full_slots`` that has none (the caller made room)."""
        missing = full_slots[~self.present(full_slots)]
        if len(missing) > len(self._free):
            raise RuntimeError(f"window KV pool exhausted: {len(missing)} slots asked, {len(self._free)} free")
        self.slot_of[missing], self._free = self._free[: len(missing)], self._free[len(missing) :]

    def release(self, full_slots: torch.Tensor) -> int:
        """Drop the windowed layers' KV of ``full_slots`` (those that have it); returns how many."""
        held = full_slots[self.present(full_slots)]
        self._free = torch.cat([self._free, self.slot_of[held]])
        self.slot_of[held] = ABSENT
        return len(held)

    def adopt(self, cached: torch.Tensor, duplicates: torch.Tensor) -> None:
        """``duplicates`` computed the same tokens as ``cached`` (inserted first by another request) and
        are about to be freed: their windowed layers' KV moves to the cached slots that lack it."""
        move = ~self.present(cached) & self.present(duplicates)
        self.slot_of[cached[move]] = self.slot_of[duplicates[move]]
        self.slot_of[duplicates[move]] = ABSENT

    def usable_len(self, full_slots: torch.Tensor, page_size: int) -> int:
        """The longest whole-page prefix of ``full_slots`` (a cached prefix, in order) that a request
        can start from: the windowed layers' KV of its last ``window - 1`` tokens all exists."""
        n = len(full_slots)
        if n < page_size:
            return 0
        missing = torch.where(self.present(full_slots), -1, torch.arange(n))
        last_missing = torch.cummax(missing, dim=0).values  # at or before each position
        ends = torch.arange(page_size, n + 1, page_size)  # candidate prefix lengths
        # A prefix of length e needs positions max(0, e - window + 1) .. e - 1.
        ok = last_missing[ends - 1] < (ends - self.window + 1).clamp(min=0)
        good = ends[ok]
        return int(good[-1]) if len(good) else 0

    def check_integrity(self) -> None:
        """Every window slot but the scratch one is either free or held by exactly one full slot."""
        held = self.slot_of[self.slot_of != ABSENT]
        every = torch.cat([held, self._free]).sort().values
        assert torch.equal(every, torch.arange(1, self.capacity + 1)), "window slots lost or held twice"
