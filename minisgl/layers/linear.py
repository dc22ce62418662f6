from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn


class Reducer(Protocol):
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the tensor-parallel ranks (in place) and return it."""
        ...


@dataclass(frozen=True)
class Partition:
    """The share of a weight one tensor-parallel rank holds (Megatron-style).

    ``column``: rows of the [out, in] weight (output features). A fused weight lists one range per
    checkpoint part, in row order (QKV: the q, k and v rows of this rank's heads); the output stays
    sharded, nothing is communicated. ``row``: the input columns ``ranges[0]``; each rank's partial
    product is summed over the ranks with ``group.all_reduce``, then the bias (not sharded) is added
    once. The loader slices checkpoint tensors with the same ranges.
    """

    kind: Literal["column", "row"]
    ranges: tuple[tuple[int, int], ...]
    group: Reducer

    @property
    def size(self) -> int:
        return sum(end - start for start, end in self.ranges)


def column(group: Reducer | None, *ranges: tuple[int, int]) -> Partition | None:
    """A column partition, or None (the whole weight) without tensor parallelism."""
    return None if group is None else Partition("column", ranges, group)


def row(group: Reducer | None, cols: tuple[int, int]) -> Partition | None:
    return None if group is None else Partition("row", (cols,), group)


# On CPU a product with few rows runs much faster as (W x^T)^T than as F.linear's x W^T. Measured
# on the 2-core CI machine over SmolLM2's 30 layers of weights (streamed from memory, as in decode):
# 1 row 36.5 -> 14.7 ms, 2 rows 59 -> 14, 8 rows 42 -> 33, 32 rows 68 -> 63; from 64 rows on F.linear
# wins. For the 49k-row LM head it wins up to 512 rows. A single row is doubled: BLAS's
# matrix-vector kernel reads memory at a third of the speed of its matrix kernel.
SMALL_PRODUCT_ROWS = 32


def weight_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, max_rows: int = SMALL_PRODUCT_ROWS
) -> torch.Tensor:
    """x W^T (+ b) for x: [rows, in], W: [out, in]; computed as (W x^T)^T on CPU up to ``max_rows`` rows."""
    rows = x.shape[0]
    if x.device.type != "cpu" or rows > max_rows:
        return F.linear(x, weight, bias)
    if rows == 1:
        x = torch.cat([x, x])
    y = torch.mm(weight, x.t())[:, :rows].t().contiguous()
    return y if bias is None else y + bias


class Linear(nn.Module):
    """y = x W^T (+ b). Fused projections (QKV, gate/up) are one ``Linear`` whose rows are the
    concatenated rows of the separate checkpoint matrices: one matmul instead of three.

    ``in_features``/``out_features`` are the full model's; with a ``partition`` the parameters
    hold only this rank's share."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, partition: Partition | None = None
    ) -> None:
        super().__init__()
        self.partition = partition
        if partition is not None:
            if partition.kind == "column":
                out_features = partition.size
            else:
                in_features = partition.size
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.partition
        if p is None or p.kind == "column":
            return weight_product(x, self.weight, self.bias)
        y = p.group.all_reduce(weight_product(x, self.weight))
        return y if self.bias is None else y + self.bias


class LMHead(Linear):
    """The vocabulary projection: no bias; under tensor parallelism each rank holds a column
    partition (a vocabulary range) and returns its shard of the logits."""

    def __init__(self, hidden_size: int, vocab_size: int, partition: Partition | None = None) -> None:
        super().__init__(hidden_size, vocab_size, partition=partition)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return weight_product(x, self.weight, max_rows=512)
