"""Owns every KV slot: the free list, the prefix cache, and each request's page-table row.

What happens to each region of a request (see ``Req`` for the regions):

| event            | [0, cached_len)                 | [cached_len, computed)             | rest of [.., allocated_len) |
|------------------|---------------------------------|------------------------------------|-----------------------------|
| admission        | matched in the cache, locked    | —                                  | allocated (prompt pages)    |
| prefill chunk    | whole pages of the computed     | unaligned tail stays the request's | kept                        |
| ends (`commit`)  | part inserted; duplicates of    |                                    |                             |
|                  | pages another request inserted  |                                    |                             |
|                  | first are freed and the row     |                                    |                             |
|                  | points at the cache's copies;   |                                    |                             |
|                  | new handle locked, old unlocked |                                    |                             |
| finish (`commit`)| same insert, then unlocked:     | unaligned tail freed               | freed                       |
|                  | stays cached, evictable         |                                    |                             |

Capacity is conserved: free + evictable + protected + owned by requests = all slots.
"""

from __future__ import annotations

import torch

from minisgl.kvcache.base import PrefixCache
from minisgl.kvcache.table import TableManager
from minisgl.request import Req


def align_up(n: int, page_size: int) -> int:
    return -(-n // page_size) * page_size


class CacheManager:
    def __init__(self, cache: PrefixCache, num_pages: int, page_size: int, table: TableManager) -> None:
        self.cache, self.page_size, self.table = cache, page_size, table
        self.capacity = num_pages * page_size
        self._free_pages = torch.arange(num_pages, dtype=torch.int64)
        self._page_offsets = torch.arange(page_size, dtype=torch.int64)
        # Slots promised to admitted requests but not allocated yet: admission never overcommits.
        self._reserved = 0
        self.evicted_tokens = 0

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
        # At least one prompt token is always computed: its logits give the first output token.
        return torch.tensor(req.token_ids[: req.prompt_len - 1], dtype=torch.int64)

    def try_admit(self, req: Req) -> bool:
        """Lock the request's cached prefix and reserve slots for the rest of its lifetime."""
        handle = self.cache.match_prefix(self._matchable(req), req.namespace).handle
        self.cache.lock_handle(handle)
        need = align_up(req.max_kv_len, self.page_size) - handle.cached_len
        if self.unreserved_size < need:
            self.cache.lock_handle(handle, unlock=True)
            return False
        req.row = self.table.allocate()
        req.handle, req.cached_len, req.device_len = handle, handle.cached_len, handle.cached_len
        req.allocated_len = req.cached_prompt_tokens = handle.cached_len
        self.table.page_table[req.row, : handle.cached_len] = handle.get_matched_indices()
        self._reserved += need
        return True

    # -- allocation ----------------------------------------------------------------------------
    def allocate(self, reqs: list[Req], lengths: list[int]) -> None:
        """Give each request KV slots for positions up to its entry in ``lengths``."""
        num_pages = [max(0, align_up(n, self.page_size) - r.allocated_len) // self.page_size for r, n in zip(reqs, lengths)]
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

    def _take_pages(self, n: int) -> torch.Tensor:
        if n > len(self._free_pages):
            freed = self.cache.evict((n - len(self._free_pages)) * self.page_size)
            self.evicted_tokens += len(freed)
            self._free_slots(freed)
        pages, self._free_pages = self._free_pages[:n], self._free_pages[n:]
        return pages

    def _free_slots(self, slots: torch.Tensor) -> None:
        """Return whole pages, given all their slots in page order."""
        if len(slots):
            self._free_pages = torch.cat([self._free_pages, slots[:: self.page_size].cpu() // self.page_size])

    # -- insertion and release -----------------------------------------------------------------
    def commit(self, req: Req, finished: bool) -> None:
        """Hand the request's computed KV to the prefix cache (see the table above)."""
        row = self.table.page_table[req.row]
        ids = torch.tensor(req.token_ids[: req.device_len], dtype=torch.int64)
        already_cached, handle = self.cache.insert_prefix(ids, row[: req.device_len], req.namespace)
        if already_cached > req.cached_len:
            self._free_slots(row[req.cached_len : already_cached])
            row[: handle.cached_len] = handle.get_matched_indices()
        # Lock the new handle before unlocking the old one so the shared path never looks evictable.
        self.cache.lock_handle(handle)
        assert req.handle is not None
        self.cache.lock_handle(req.handle, unlock=True)
        req.handle, req.cached_len = handle, handle.cached_len
        if finished:
            self.cache.lock_handle(handle, unlock=True)
            self._free_slots(row[req.cached_len : req.allocated_len])
            self._reserved -= align_up(req.max_kv_len, self.page_size) - req.allocated_len
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
        pages = torch.cat([self._free_pages, owned[:: self.page_size] // self.page_size])
        assert len(torch.unique(pages)) == len(pages), "a KV page is owned twice"
        assert self._reserved >= 0, f"negative reservation {self._reserved}"
        if not running:
            assert self._reserved == 0, f"idle engine still reserves {self._reserved} slots"
