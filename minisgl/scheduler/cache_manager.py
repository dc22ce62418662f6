"""Owns every KV slot: the free list, the prefix cache, and each request's page-table row.

What happens to each region of a request (see ``Req`` for the regions):

| event            | [0, cached_len)                 | [cached_len, computed)             | rest of [.., allocated_len) |
|------------------|---------------------------------|------------------------------------|-----------------------------|
| admission        | matched in the cache, locked    | —                                  | allocated (prompt pages)    |
| prefill chunk    | whole pages of the computed     | unaligned tail stays the request's | kept                        |
| decode step      | —                               | —                                  | when used up, DECODE_RUN    |
|                  |                                 |                                    | positions' more at once     |
| ends (`commit`)  | part inserted; duplicates of    |                                    |                             |
|                  | pages another request inserted  |                                    |                             |
|                  | first are freed and the row     |                                    |                             |
|                  | points at the cache's copies;   |                                    |                             |
|                  | new handle locked, old unlocked |                                    |                             |
| finish (`commit`)| same insert, then unlocked:     | unaligned tail freed               | freed                       |
|                  | stays cached, evictable         |                                    |                             |

Capacity is conserved: free + evictable + protected + owned by requests = all slots.

A model whose sliding-window layers have a pool of their own (``kvcache/window.py``) also has a window
slot for some of those tokens; what happens to them:

| event                 | window slots                                                              |
|-----------------------|---------------------------------------------------------------------------|
| admission             | a cached prefix is matched only as far as its last window - 1 tokens have |
|                       | them; window slots for the request's lifetime are reserved                |
| before a pass         | its own tokens out of the window are released; each new token a later    |
|                       | pass reads gets one (the last window - 1 of a chunk, every decode token), |
|                       | the chunk's others too while the pool has room, evicting cached ones      |
|                       | least recently used first, never those in a running request's window      |
| commit                | they go to the cache with their tokens; a duplicate's move to the cached  |
|                       | token that lacks one                                                      |
| a full slot is freed  | its window slot too                                                       |

Window slots are conserved too: free + held for cached tokens + held for requests' own = all.
"""

from __future__ import annotations

import torch

from minisgl.kvcache.base import PrefixCache
from minisgl.kvcache.table import TableManager
from minisgl.kvcache.window import WindowSlots
from minisgl.request import Req
from minisgl.tuning import DECODE_RUN

_NO_SLOTS = torch.empty(0, dtype=torch.int64)


def align_up(n: int, page_size: int) -> int:
    return -(-n // page_size) * page_size


class FreePages:
    """The free KV pages. Pages used before go out first (in the order they were freed), never-used ones
    (in page order) only when none of those is left. The CPU pool's memory is the kernel's zero pages
    until first written (``kvcache/pool.py``): its resident memory, and the page faults of first writes,
    then stay within the most KV ever held at once instead of growing through the whole pool."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._used = torch.empty(0, dtype=torch.int64)  # freed after use, oldest first
        self._next_fresh = 0  # pages from here on were never handed out

    def __len__(self) -> int:
        return len(self._used) + self.num_pages - self._next_fresh

    def take(self, n: int) -> torch.Tensor:
        assert n <= len(self), f"{n} pages asked, {len(self)} free"
        used, self._used = self._used[:n], self._used[n:]
        fresh = torch.arange(self._next_fresh, self._next_fresh + n - len(used), dtype=torch.int64)
        self._next_fresh += len(fresh)
        return torch.cat([used, fresh])

    def give(self, pages: torch.Tensor) -> None:
        self._used = torch.cat([self._used, pages])

    def pages(self) -> torch.Tensor:
        """Every free page (for the accounting check)."""
        return torch.cat([self._used, torch.arange(self._next_fresh, self.num_pages, dtype=torch.int64)])


class CacheManager:
    def __init__(
        self,
        cache: PrefixCache,
        num_pages: int,
        page_size: int,
        table: TableManager,
        window: WindowSlots | None = None,
        window_per_request: int = 0,
    ) -> None:
        """``window``: the window slots of a model whose sliding-window layers have a pool of their own
        (``table.window_table`` maps to them), ``window_per_request`` the most one request holds at once
        (``window.slots_per_request``)."""
        self.cache, self.page_size, self.table = cache, page_size, table
        self.capacity = num_pages * page_size
        self._free_pages = FreePages(num_pages)
        self._page_offsets = torch.arange(page_size, dtype=torch.int64)
        # Slots promised to admitted requests but not allocated yet: admission never overcommits.
        self._reserved = 0
        self.evicted_tokens = 0
        self.window, self._window_per_request = window, window_per_request
        self._window_reserved = 0  # window slots promised to admitted requests
        self._admitted: dict[int, Req] = {}  # by page-table row: whose windows eviction must keep
        self.window_evicted_tokens = 0

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def free_size(self) -> int:
        return len(self._free_pages) * self.page_size

    @property
    def available_size(self) -> int:
        """Slots that could be handed out now: free ones plus those the cache can evict."""
        return self.free_size + self.cache.size_info.evictable

    @property
    def unreserved_size(self) -> int:
        """Available slots not yet promised to an admitted request: what admission can give out."""
        return self.available_size - self._reserved

    # -- admission -----------------------------------------------------------------------------
    def match_len(self, req: Req) -> int:
        """The prefix ``try_admit`` would reuse; a read-only peek (no split, no LRU refresh)."""
        return self.cache.match_len(self._matchable(req), req.namespace)

    @staticmethod
    def _matchable(req: Req) -> torch.Tensor:
        # At least one prompt token is always computed: its logits give the first output token. A request
        # that scores its prompt needs the logits of every prompt token: it matches nothing.
        end = 0 if req.scores_prompt else req.prompt_len - 1
        return torch.tensor(req.token_ids[:end], dtype=torch.int64)

    def try_admit(self, req: Req) -> bool:
        """Lock the request's cached prefix and reserve slots for the rest of its lifetime."""
        handle = self.cache.match_prefix(self._matchable(req), req.namespace).handle
        self.cache.lock_handle(handle)
        need = align_up(req.max_kv_len, self.page_size) - handle.cached_len
        window_need = self._window_need(req)
        if self.unreserved_size < need or self._window_reserved + window_need > self._window_capacity:
            self.cache.lock_handle(handle, unlock=True)
            return False
        req.row = self.table.allocate()
        req.handle, req.cached_len, req.device_len = handle, handle.cached_len, handle.cached_len
        req.allocated_len = req.cached_prompt_tokens = req.window_released_len = handle.cached_len
        self._set_row(req, handle.get_matched_indices())
        self._reserved += need
        self._window_reserved += window_need
        self._admitted[req.row] = req
        return True

    def _window_need(self, req: Req) -> int:
        return min(align_up(req.max_kv_len, self.page_size), self._window_per_request) if self.window else 0

    @property
    def _window_capacity(self) -> int:
        return self.window.capacity if self.window is not None else 0

    def _set_row(self, req: Req, slots: torch.Tensor) -> None:
        """The request's first ``len(slots)`` positions are held by ``slots`` (and their window slots)."""
        self.table.page_table[req.row, : len(slots)] = slots
        if self.window is not None:
            assert self.table.window_table is not None
            self.table.window_table[req.row, : len(slots)] = self.window.slot_of[slots.cpu()].to(slots.device)

    # -- allocation ----------------------------------------------------------------------------
    def allocate(self, reqs: list[Req], lengths: list[int]) -> None:
        """Give each request KV slots for positions up to its entry in ``lengths`` (or further:
        ``_run_end``)."""
        ends = [self._run_end(r, n) for r, n in zip(reqs, lengths)]
        num_pages = [
            max(0, align_up(n, self.page_size) - r.allocated_len) // self.page_size for r, n in zip(reqs, ends)
        ]
        pages = self._take_pages(sum(num_pages))
        slots = (pages.unsqueeze(1) * self.page_size + self._page_offsets).flatten()
        start = 0
        for req, n in zip(reqs, num_pages):
            if n == 0:
                continue
            size = n * self.page_size
            self.table.page_table[req.row, req.allocated_len : req.allocated_len + size] = slots[start : start + size]
            req.allocated_len += size
            start += size
        self._reserved -= len(slots)
        if self.window is not None:
            self._place_window(reqs, lengths)

    @staticmethod
    def _run_end(req: Req, length: int) -> int:
        """Where ``req``'s slots end after an allocation up to ``length``. A decoding request that runs
        out gets ``DECODE_RUN`` positions' worth at once, out of the slots reserved for its lifetime: a
        batch's decode steps would otherwise deal one slot to each request in turn, its keys would lie a
        batch apart in the pool, and decode attention reads scattered keys slower than consecutive ones."""
        if req.is_prefilling or length <= req.allocated_len:
            return length
        return max(length, min(req.allocated_len + DECODE_RUN, req.max_kv_len))

    def _place_window(self, reqs: list[Req], lengths: list[int]) -> None:
        """Before a pass computing each request's positions up to its entry in ``lengths``: release
        the window slots of its own tokens no later query sees, and give the new tokens theirs."""
        window, table = self.window, self.table
        assert window is not None and table.window_table is not None
        reach = window.window - 1  # keys a query sees before its own position
        needed: list[torch.Tensor] = []  # full slots that must have a window slot for this pass
        optional: list[torch.Tensor] = []  # chunk tokens no later pass reads: kept if there is room
        new_slots: list[torch.Tensor] = []  # each request's new tokens' full slots
        for req, end in zip(reqs, lengths):
            row = table.page_table[req.row]
            new_slots.append(row[req.device_len : end])
            start = max(req.window_released_len, req.cached_len)
            stop = req.device_len - reach
            if stop > start:
                window.release(row[start:stop].cpu())
                req.window_released_len = stop
            # A decode pass reads its new tokens back from the pool (one, plus a draft: what
            # ``slots_per_request`` reserves past the window); a prefill chunk reads them fresh.
            read_back = not req.is_prefilling and end - req.device_len <= self._window_per_request - reach
            keep_from = req.device_len if read_back else max(req.device_len, end - reach)
            needed.append(row[keep_from:end].cpu())
            if req.is_prefilling:  # a chunk goes to the cache after the pass, its window KV with it
                optional.append(row[req.device_len : keep_from].cpu().flip(0))  # the latest first
        must, extra = torch.cat(needed), torch.cat([_NO_SLOTS, *optional])
        missing = int((~window.present(must)).sum())
        self._make_window_room(missing + len(extra))
        window.assign(must)
        if window.free_size:
            window.assign(extra[: window.free_size])
        for req, end, slots in zip(reqs, lengths, new_slots):
            table.window_table[req.row, req.device_len : end] = window.slot_of[slots.cpu()].to(slots.device)

    def _make_window_room(self, n: int) -> None:
        """Evict cached tokens' window slots, least recently used first, until ``n`` are free or only
        those in an admitted request's window are left."""
        window = self.window
        assert window is not None
        if window.free_size >= n:
            return
        kept = torch.zeros(len(window.slot_of), dtype=torch.bool)
        for req in self._admitted.values():
            first = max(0, req.device_len - window.window + 1)
            kept[self.table.page_table[req.row, first : req.device_len].cpu()] = True
        for slots in self.cache.slots_by_age():
            self.window_evicted_tokens += window.release(slots[~kept[slots]])
            if window.free_size >= n:
                return

    def _take_pages(self, n: int) -> torch.Tensor:
        if n > len(self._free_pages):
            freed = self.cache.evict((n - len(self._free_pages)) * self.page_size)
            self.evicted_tokens += len(freed)
            self._free_slots(freed)
        return self._free_pages.take(n)

    def _free_slots(self, slots: torch.Tensor) -> None:
        """Return whole pages, given all their slots in page order (and their window slots)."""
        if len(slots):
            self._free_pages.give(slots[:: self.page_size].cpu() // self.page_size)
            if self.window is not None:
                self.window.release(slots.cpu())

    # -- insertion and release -----------------------------------------------------------------
    def commit(self, req: Req, finished: bool) -> None:
        """Hand the request's computed KV to the prefix cache (see the table above)."""
        row = self.table.page_table[req.row]
        ids = torch.tensor(req.token_ids[: req.device_len], dtype=torch.int64)
        already_cached, handle = self.cache.insert_prefix(ids, row[: req.device_len], req.namespace)
        if already_cached > req.cached_len:
            matched = handle.get_matched_indices()
            if self.window is not None:
                computed_twice = slice(req.cached_len, already_cached)
                self.window.adopt(matched[computed_twice].cpu(), row[computed_twice].cpu())
            self._free_slots(row[req.cached_len : already_cached])
            self._set_row(req, matched)
        # Lock the new handle before unlocking the old one so the shared path never looks evictable.
        self.cache.lock_handle(handle)
        assert req.handle is not None
        self.cache.lock_handle(req.handle, unlock=True)
        req.handle, req.cached_len = handle, handle.cached_len
        if finished:
            self.cache.lock_handle(handle, unlock=True)
            self._free_slots(row[req.cached_len : req.allocated_len])
            self._reserved -= align_up(req.max_kv_len, self.page_size) - req.allocated_len
            self._window_reserved -= self._window_need(req)
            del self._admitted[req.row]
            self.table.free(req.row)
            req.row, req.handle = -1, None

    def flush(self) -> None:
        self._free_slots(self.cache.reset())

    # -- accounting ----------------------------------------------------------------------------
    def owned_slots(self, running: list[Req]) -> torch.Tensor:
        rows = [self.table.page_table[r.row, r.cached_len : r.allocated_len] for r in running]
        return torch.cat(rows) if rows else torch.empty(0, dtype=torch.int64)

    def check_accounting(self, running: list[Req]) -> None:
        """free + evictable + protected + owned by requests == capacity, and no page twice."""
        self.cache.check_integrity()
        owned = self.owned_slots(running).cpu()
        evictable, protected = self.cache.size_info
        total = self.free_size + evictable + protected + len(owned)
        assert total == self.capacity, f"KV accounting off: {total} != capacity {self.capacity}"
        pages = torch.cat([self._free_pages.pages(), owned[:: self.page_size] // self.page_size])
        assert len(torch.unique(pages)) == len(pages), "a KV page is owned twice"
        assert self._reserved >= 0, f"negative reservation {self._reserved}"
        if not running:
            assert self._reserved == 0, f"idle engine still reserves {self._reserved} slots"
        assert set(self._admitted.values()) == set(running), "the admitted requests drifted"
        if self.window is not None:
            self._check_window(running, owned)

    def _check_window(self, running: list[Req], owned: torch.Tensor) -> None:
        """free + held for cached tokens + held for requests' own = all window slots; every running
        request's window is held, and its window table row says where."""
        window, table = self.window, self.table.window_table
        assert window is not None and table is not None
        window.check_integrity()
        holders = torch.zeros(len(window.slot_of), dtype=torch.bool)
        holders[torch.cat([_NO_SLOTS, owned, *self.cache.slots_by_age()])] = True
        assert not bool(window.present(torch.arange(len(holders))[~holders]).any()), "a free KV slot holds a window slot"
        for req in running:
            first = max(0, req.device_len - window.window + 1)
            slots = self.table.page_table[req.row, first : req.device_len].cpu()
            assert bool(window.present(slots).all()), f"request {req.rid} lost window KV it still reads"
            mapped = table[req.row, first : req.device_len].cpu()
            assert torch.equal(mapped, window.slot_of[slots]), f"request {req.rid}'s window table is stale"
        reserved = sum(self._window_need(r) for r in running)
        assert self._window_reserved == reserved, f"window reservation {self._window_reserved} != {reserved}"

    def window_usage(self, running: list[Req]) -> dict[str, int]:
        """Window slots by state (models with a window pool; else empty)."""
        window = self.window
        if window is None:
            return {}
        held_by_requests = int(window.present(self.owned_slots(running).cpu()).sum())
        return {
            "window_capacity": window.capacity,
            "window_free": window.free_size,
            "window_cached": window.capacity - window.free_size - held_by_requests,
            "window_in_use": held_by_requests,
            "window_evicted_total": self.window_evicted_tokens,
        }
