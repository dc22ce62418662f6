from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.layers.linear import Partition
from minisgl.layers.quant import QuantizedWeight


class VocabEmbedding(nn.Module):
    """Token embedding. With a (column) ``partition`` a rank holds the rows of its vocabulary range:
    ids outside it look up zeros, and the sum over ranks gives every token its row."""

    def __init__(self, vocab_size: int, hidden_size: int, partition: Partition | None = None) -> None:
        super().__init__()
        self.partition = partition
        rows = vocab_size if partition is None else partition.size
        self.shape = (rows, hidden_size)
        self.weight: nn.Parameter | None = nn.Parameter(torch.empty(rows, hidden_size))
        self.quantized: QuantizedWeight | None = None  # set by ``quantize``: lookups dequantize its rows
        self.dtype = torch.float32  # of the looked-up rows once quantized (the model's)

    def quantize(self, weight: QuantizedWeight, dtype: torch.dtype) -> None:
        """Look rows up in ``weight`` (same shape, quantized; a tied LM head's), as ``dtype``, from
        now on; the dense table is dropped."""
        if (weight.out_features, weight.in_features) != self.shape:
            raise ValueError(f"quantized embedding {weight} does not match the table's {self.shape}")
        self.quantized, self.dtype = weight, dtype
        self.weight = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        p = self.partition
        if p is None:
            return self._lookup(input_ids)
        start, end = p.ranges[0]
        outside = (input_ids < start) | (input_ids >= end)
        x = self._lookup((input_ids - start).masked_fill(outside, 0))
        return p.group.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0.0))

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            rows = self.quantized.lookup(ids.reshape(-1)).to(self.dtype)
            return rows.view(*ids.shape, self.shape[1])
        assert self.weight is not None, "an embedding without a quantized table keeps its dense one"
        return F.embedding(ids, self.weight)
