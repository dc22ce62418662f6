"""The prefix-cache interface every cache implementation plugs into.

A prefix cache maps token-id prefixes to the KV slots that already hold their keys and values.
Slots are token-granular (one index per token, like the page table); with ``page_size > 1`` only
whole pages are ever stored, so every stored run of slots is a run of whole pages.

Ownership rule: slots handed to ``insert_prefix`` beyond the returned ``cached_len`` belong to the
cache from then on; the caller frees its own copies of ``[its cached_len, returned cached_len)``.
Slots under a locked handle are never evicted.

A ``match_limit`` (a model with a window pool: ``WindowSlots.usable_len``) cuts every match short to
the longest part of it a request can start from, given the KV slots the cache holds for it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Container, Iterator
from typing import NamedTuple

import torch

from minisgl.kvcache.snapshot import TreeSnapshot

# The longest prefix of a cached run of KV slots (the match, in order) that a request may start from.
MatchLimit = Callable[[torch.Tensor], int]


class CacheHandle(ABC):
    """A position in the cache: the end of a matched or inserted prefix."""

    cached_len: int

    @abstractmethod
    def get_matched_indices(self) -> torch.Tensor:
        """The KV slots of the whole prefix ``[0, cached_len)``, as a 1-D int64 tensor."""


class MatchResult(NamedTuple):
    handle: CacheHandle


class InsertResult(NamedTuple):
    cached_len: int  # how much of the inserted prefix the cache already held before this call
    handle: CacheHandle  # points at the end of the inserted (page-aligned) prefix


class SizeInfo(NamedTuple):
    evictable: int  # tokens held by the cache under no lock
    protected: int  # tokens held by the cache under at least one lock

    @property
    def total(self) -> int:
        return self.evictable + self.protected


class PrefixCache(ABC):
    """Pluggable prefix cache; see the module docstring for who owns which slots."""

    # Whether a request can reuse what another inserted: the scheduler then holds back a request
    # that shares a long uncached prefix with one being prefilled, rather than compute it twice.
    shares_prefixes: bool = True

    def __init__(self, device: torch.device | str, page_size: int = 1, match_limit: MatchLimit | None = None) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.device = torch.device(device)
        self.page_size = page_size
        self.match_limit = match_limit

    @abstractmethod
    def match_prefix(self, input_ids: torch.Tensor, namespace: str | None = None) -> MatchResult:
        """Longest cached prefix of ``input_ids`` (page-aligned), as a handle to lock. Does not lock
        it, but may reshape the cache so the handle ends exactly there, and counts as a use (LRU)."""

    @abstractmethod
    def match_len(self, input_ids: torch.Tensor, namespace: str | None = None) -> int:
        """Length of what ``match_prefix`` would match. Read-only: the cache, its structure and
        its eviction order are left exactly as they were (a peek, e.g. to rank waiting requests)."""

    def continuation(self, input_ids: torch.Tensor, namespace: str | None, max_len: int) -> list[int]:
        """Up to ``max_len`` cached tokens that follow the whole of ``input_ids`` (what an earlier request
        with this context went on with), a draft for speculative decoding. Read-only like ``match_len``;
        empty where nothing cached continues it, or for a cache that keeps no tree."""
        return []

    def slots_by_age(self) -> Iterator[torch.Tensor]:
        """The KV slots the cache holds, a run per entry, least recently used first (what a second pool
        evicts its part of first); nothing for a cache that holds nothing."""
        return iter(())

    @abstractmethod
    def insert_prefix(
        self, input_ids: torch.Tensor, indices: torch.Tensor, namespace: str | None = None
    ) -> InsertResult:
        """Store the whole pages of ``input_ids`` whose KV lives in ``indices``."""

    @abstractmethod
    def lock_handle(self, handle: CacheHandle, unlock: bool = False) -> None:
        """Protect (or release) the prefix under ``handle`` from eviction."""

    @abstractmethod
    def evict(self, num_tokens: int) -> torch.Tensor:
        """Free at least ``num_tokens`` evictable tokens; returns the freed KV slots."""

    @abstractmethod
    def reset(self) -> torch.Tensor:
        """Drop every entry (all must be unlocked); returns the freed KV slots."""

    @property
    @abstractmethod
    def size_info(self) -> SizeInfo: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Re-derive every counter from scratch and raise ``AssertionError`` on a mismatch."""

    def snapshot(
        self, max_nodes: int, head_tokens: int, label: Callable[[str | None], str], shown: Container[str | None]
    ) -> TreeSnapshot | None:
        """A read-only picture of the cached prefixes (``RadixPrefixCache.snapshot``); None for a
        cache that keeps no tree."""
        return None
