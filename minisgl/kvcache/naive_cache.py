"""A prefix cache that caches nothing: every request computes its whole prompt."""

from __future__ import annotations

import torch

from minisgl.kvcache.base import CacheHandle, InsertResult, MatchResult, PrefixCache, SizeInfo


class _EmptyHandle(CacheHandle):
    cached_len = 0

    def get_matched_indices(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64)


class NaivePrefixCache(PrefixCache):
    shares_prefixes = False
    _EMPTY = _EmptyHandle()

    def match_prefix(self, input_ids: torch.Tensor, namespace: str | None = None) -> MatchResult:
        return MatchResult(self._EMPTY)

    def match_len(self, input_ids: torch.Tensor, namespace: str | None = None) -> int:
        return 0

    def insert_prefix(
        self, input_ids: torch.Tensor, indices: torch.Tensor, namespace: str | None = None
    ) -> InsertResult:
        return InsertResult(0, self._EMPTY)

    def lock_handle(self, handle: CacheHandle, unlock: bool = False) -> None:
        pass

    def evict(self, num_tokens: int) -> torch.Tensor:
        if num_tokens > 0:
            raise ValueError(f"cannot evict {num_tokens} tokens: the naive cache holds none")
        return torch.empty(0, dtype=torch.int64)

    def reset(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64)

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(0, 0)

    def check_integrity(self) -> None:
        pass
