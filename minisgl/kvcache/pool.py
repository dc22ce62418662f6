"""The paged KV pool: one K tensor and one V tensor for all layers, indexed by KV slot."""

from __future__ import annotations

import numpy as np
import torch


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        shape = (num_layers, num_pages * page_size, num_kv_heads, head_dim)
        # Zeroed, not empty: padded attention reads unused slots under a zero weight, and
        # 0 * NaN from uninitialised memory would poison the output.
        self.k = _zeros(shape, dtype, device)
        self.v = _zeros(shape, dtype, device)

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the new tokens' K/V in place at their slots (cast to the pool's dtype)."""
        self.k[layer_id].index_copy_(0, slots, k.to(self.k.dtype))
        self.v[layer_id].index_copy_(0, slots, v.to(self.v.dtype))

    def rounded(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as the pool holds it, in ``x``'s dtype: a pass that attends its fresh K/V sees the
        values a later pass reads back from the pool."""
        return x if x.dtype == self.k.dtype else x.to(self.k.dtype).to(x.dtype)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed tensor. On the CPU from the kernel's zero pages (numpy's calloc): the pool costs no time
    at start and its memory is taken as slots are first written, where ``torch.zeros`` writes every page
    of it before the server can answer (``python -m benchmarks.cold_start --server``)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    same_width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
    return torch.from_numpy(np.zeros(shape, dtype=same_width)).view(dtype)
