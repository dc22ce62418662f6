"""The gated MLP of every supported family (SwiGLU; GeGLU for Gemma); also one expert of a MoE block."""

from __future__ import annotations

from functools import cached_property

import torch
from torch import nn

from minisgl.layers.activation import gated_activation
from minisgl.layers.linear import Linear, RankGroup, column, row
from minisgl.layers.quant import QuantizedWeight
from minisgl.tuning import mlp_band_rows


class GatedMLP(nn.Module):
    """down(act(gate x) * up x), gate and up fused into one matmul; ``activation``: a config's
    ``hidden_act`` (``silu`` unless set). Tensor parallelism splits the
    intermediate dimension: this rank holds ``part`` of it, gate/up by columns, down by rows
    (all-reduced unless ``reduce=False``, where the caller sums several MLPs' partial outputs and
    reduces once)."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        tp: RankGroup | None,
        part: tuple[int, int],
        reduce: bool = True,
        activation: str = "silu",
    ) -> None:
        super().__init__()
        self.activation = activation
        self.act_and_mul = gated_activation(activation)
        self.gate_up_proj = Linear(hidden, 2 * intermediate, partition=column(tp, part, part))
        self.down_proj = Linear(intermediate, hidden, partition=row(tp, part, reduce))
        self.band_rows = mlp_band_rows(part[1] - part[0])  # rows of a long pass computed at a time

    def forward(self, x: torch.Tensor, prefill_rows: int = 0) -> torch.Tensor:
        """The first ``prefill_rows`` rows are prefill tokens (``Batch.prefill_tokens``)."""
        if len(x) <= self.band_rows:
            return self._band(x, prefill_rows)
        # A long prefill pass a band of rows at a time: its intermediate activations (gate_up, 2 x
        # intermediate per row, and SwiGLU's where it is written out) would otherwise be the engine's largest
        # temporaries.
        out = x.new_empty(len(x), self.down_proj.shape[0])
        for start in range(0, len(x), self.band_rows):
            band = x[start : start + self.band_rows]
            self._band(band, min(max(prefill_rows - start, 0), len(band)), out[start : start + len(band)])
        return out

    def _band(self, x: torch.Tensor, prefill_rows: int, out: torch.Tensor | None = None) -> torch.Tensor:
        gate_up = self.gate_up_proj(x, prefill_rows)
        if self._gated_down is not None and gate_up.dtype == torch.float32:
            return self._gated_down.forward_gated(gate_up, prefill_rows, out)
        return self.down_proj(self._act_and_mul(gate_up), prefill_rows, out)

    @cached_property
    def _gated_down(self) -> QuantizedWeight | None:
        """The down projection's weight where it takes gate_up itself (``QuantizedWeight.forward_gated``):
        the C kernels run both projections, SwiGLU is the activation and the down projection is one rank's
        whole weight without a bias. The same bits as ``_act_and_mul``'s activation and then the product."""
        gate_up, down = self.gate_up_proj.quantized, self.down_proj.quantized
        if gate_up is None or gate_up.kernels is None or down is None or down.c_matmul is None:
            return None
        if self.activation != "silu" or self.down_proj.partition is not None or self.down_proj.bias is not None:
            return None
        return down

    def _act_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """Quantized weights with the C kernels take their SwiGLU from the kernels too (the fused decode
        step's, ``activation.c``); dense weights keep torch's, which matches transformers' bits."""
        quantized = self.gate_up_proj.quantized
        kernels = None if quantized is None else quantized.kernels
        if kernels is not None and self.activation == "silu" and gate_up.dtype == torch.float32 and gate_up.is_cpu:
            return kernels.silu_and_mul(gate_up)
        return self.act_and_mul(gate_up)
