"""Attention backends: turn a batch into an ``AttentionContext`` the model's layers call."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from minisgl.engine.batch import Batch
from minisgl.kvcache.pool import KVPool
from minisgl.models.decoder import AttentionContext


class AttentionBackend(ABC):
    def __init__(self, pool: KVPool, page_table: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.pool, self.page_table = pool, page_table
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim

    @abstractmethod
    def prepare(self, batch: Batch) -> AttentionContext:
        """Build everything the layers need once per batch, so no layer recomputes it."""


_REGISTRY: dict[str, Callable[..., AttentionBackend]] = {}


def register_backend(name: str) -> Callable[[type[AttentionBackend]], type[AttentionBackend]]:
    def wrap(cls: type[AttentionBackend]) -> type[AttentionBackend]:
        _REGISTRY[name] = cls
        return cls

    return wrap


def backend_names() -> list[str]:
    from minisgl.attention import torch_backend  # noqa: F401  (importing registers "torch")

    return sorted(_REGISTRY)


def create_backend(name: str, pool: KVPool, page_table: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> AttentionBackend:
    if name not in backend_names():
        raise ValueError(f"unknown attention backend {name!r}; choose one of {backend_names()}")
    return _REGISTRY[name](pool, page_table, num_heads, num_kv_heads, head_dim)
