"""The SwiGLU MLP of every supported family; also one expert of a MoE block."""

from __future__ import annotations

import torch
from torch import nn

from minisgl.layers.activation import silu_and_mul
from minisgl.layers.linear import Linear, RankGroup, column, row


class GatedMLP(nn.Module):
    """down(silu(gate x) * up x), gate and up fused into one matmul. Tensor parallelism splits the
    intermediate dimension: this rank holds ``part`` of it, gate/up by columns, down by rows
    (all-reduced unless ``reduce=False``, where the caller sums several MLPs' partial outputs and
    reduces once)."""

    def __init__(
        self, hidden: int, intermediate: int, tp: RankGroup | None, part: tuple[int, int], reduce: bool = True
    ) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * intermediate, partition=column(tp, part, part))
        self.down_proj = Linear(intermediate, hidden, partition=row(tp, part, reduce))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))
