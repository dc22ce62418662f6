"""The attention backends by name (``EngineConfig.attention_backend``)."""

from __future__ import annotations

import torch

from minisgl.attention.base import AttentionBackend
from minisgl.attention.torch_backend import TorchAttentionBackend
from minisgl.kvcache.pool import KVPool
from minisgl.registry import Registry

ATTENTION_BACKENDS: Registry[type[AttentionBackend]] = Registry(
    "unknown attention backend", {"torch": TorchAttentionBackend}
)


def create_backend(
    name: str,
    pool: KVPool,
    page_table: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    layer_windows: tuple[int | None, ...] = (),
) -> AttentionBackend:
    return ATTENTION_BACKENDS.get(name)(pool, page_table, num_heads, num_kv_heads, head_dim, layer_windows)
