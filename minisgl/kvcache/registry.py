"""The prefix caches by name (``EngineConfig.cache_type``)."""

from __future__ import annotations

import torch

from minisgl.kvcache.base import MatchLimit, PrefixCache
from minisgl.kvcache.naive_cache import NaivePrefixCache
from minisgl.kvcache.radix_cache import RadixPrefixCache
from minisgl.registry import Registry

PREFIX_CACHES: Registry[type[PrefixCache]] = Registry(
    "unknown cache_type", {"naive": NaivePrefixCache, "radix": RadixPrefixCache}
)


def create_prefix_cache(
    name: str, device: torch.device | str, page_size: int = 1, match_limit: MatchLimit | None = None
) -> PrefixCache:
    return PREFIX_CACHES.get(name)(device, page_size, match_limit)
