"""Attention backends: turn a ``Batch`` into the ``AttentionContext`` the model's layers call."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from minisgl.batch import AttentionContext, Batch
from minisgl.kernels.native import CpuKernels
from minisgl.kvcache.pool import KVPool


class AttentionBackend(ABC):
    """Reads the KV of a batch's requests through ``page_table`` (shared with whoever allocates
    the slots) and writes the new tokens' K/V into ``pool``."""

    def __init__(
        self,
        pool: KVPool,
        page_table: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        layer_windows: tuple[int | None, ...] = (),
        dtype: torch.dtype | None = None,
        kernels: CpuKernels | None = None,
        window_pool: KVPool | None = None,
        window_table: torch.Tensor | None = None,
    ) -> None:
        """``layer_windows``: per layer, the sliding window its tokens attend within (position p sees
        p - window + 1 .. p), or None for full attention; empty: every layer attends fully.
        ``dtype``: the queries' (the model's; None: the pool's), which a 16-bit pool may differ from.
        ``kernels``: the engine's C kernels (None: torch's only).
        ``window_pool``, ``window_table``: where the windowed layers keep their KV, in that order, when
        they have a pool of their own (``kvcache/window.py``); ``pool`` then holds the other layers."""
        if (window_pool is None) != (window_table is None):
            raise ValueError("window_pool and window_table go together")
        self.pool, self.page_table = pool, page_table
        self.window_pool, self.window_table = window_pool, window_table
        # Each layer's index in its own pool.
        in_window = [window_pool is not None and w is not None for w in layer_windows]
        self.pool_layer_ids = [in_window[:i].count(kind) for i, kind in enumerate(in_window)]
        self.dtype = dtype if dtype is not None else pool.k.dtype
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.layer_windows = layer_windows
        self.kernels = kernels

    @abstractmethod
    def prepare(self, batch: Batch) -> AttentionContext:
        """Choose the strategy and build everything the layers need once per batch, so no layer
        call recomputes or re-decides it."""
