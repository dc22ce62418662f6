from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.layers.linear import Partition


class VocabEmbedding(nn.Module):
    """Token embedding. With a (column) ``partition`` a rank holds the rows of its vocabulary range:
    ids outside it look up zeros, and the sum over ranks gives every token its row."""

    def __init__(self, vocab_size: int, hidden_size: int, partition: Partition | None = None) -> None:
        super().__init__()
        self.partition = partition
        rows = vocab_size if partition is None else partition.size
        self.weight = nn.Parameter(torch.empty(rows, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        p = self.partition
        if p is None:
            return F.embedding(input_ids, self.weight)
        start, end = p.ranges[0]
        outside = (input_ids < start) | (input_ids >= end)
        x = F.embedding((input_ids - start).masked_fill(outside, 0), self.weight)
        return p.group.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0.0))
