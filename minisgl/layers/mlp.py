"""The gated MLP of every supported family (SwiGLU; GeGLU for Gemma); also one expert of a MoE block."""

from __future__ import annotations

from functools import cached_property

import torch
from torch import nn

from minisgl.kernels.native import PrefillMlp, RoundedRows
from minisgl.layers.activation import gated_activation
from minisgl.layers.linear import Linear, RankGroup, column, row
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

    def forward(self, x: torch.Tensor | RoundedRows, prefill_rows: int = 0) -> torch.Tensor:
        """The first ``prefill_rows`` rows are prefill tokens (``Batch.prefill_tokens``); x is rounded rows
        only where ``gate_up_proj.takes_rounded``."""
        if len(x) <= self.band_rows:
            return self._band(x, prefill_rows)
        # A long prefill pass a band of rows at a time: its intermediate activations (gate_up, 2 x
        # intermediate per row, and SwiGLU's where it is written out) would otherwise be the engine's largest
        # temporaries.
        hidden = self.down_proj.shape[0]
        out = torch.empty(len(x), hidden) if isinstance(x, RoundedRows) else x.new_empty(len(x), hidden)
        for start in range(0, len(x), self.band_rows):
            band = x[start : start + self.band_rows]
            self._band(band, min(max(prefill_rows - start, 0), len(band)), out[start : start + len(band)])
        return out

    def _band(self, x: torch.Tensor | RoundedRows, prefill_rows: int, out: torch.Tensor | None = None) -> torch.Tensor:
        fused = self._prefill_mlp if prefill_rows and isinstance(x, torch.Tensor) and x.dtype == torch.float32 else None
        if fused is None:
            act = self._act_and_mul(self.gate_up_proj(x, prefill_rows), prefill_rows)
            return self.down_proj(act, prefill_rows, out)
        y = x.new_empty(len(x), self.down_proj.shape[0]) if out is None else out
        fused(x[:prefill_rows].contiguous(), y[:prefill_rows])
        if prefill_rows < len(x):  # the decode rows: their own products (quant_gemm.c), as without the prefill rows
            self.down_proj(self._act_and_mul(self.gate_up_proj(x[prefill_rows:]), 0), 0, y[prefill_rows:])
        return y

    @cached_property
    def _prefill_mlp(self) -> PrefillMlp | None:
        """Both projections of the prefill rows in one C call (``CpuKernels.prefill_mlp``: the tile unit's,
        gate_up never written out) where it runs this MLP: SwiGLU, each projection one rank's whole weight
        without a bias in a format the call takes. The same bits as the two products and ``_act_and_mul``."""
        gate_up, down = self.gate_up_proj.quantized, self.down_proj.quantized
        if gate_up is None or down is None or gate_up.kernels is None or not gate_up.kernels.bf16_prefill:
            return None
        linears = (self.gate_up_proj, self.down_proj)
        if self.activation != "silu" or any(m.partition is not None or m.bias is not None for m in linears):
            return None
        gate_up_buffers, down_buffers = gate_up.kernel_buffers(), down.kernel_buffers()
        if gate_up_buffers is None or down_buffers is None:
            return None
        return gate_up.kernels.prefill_mlp(gate_up_buffers, down_buffers, down.out_features, down.in_features)

    def _act_and_mul(self, gate_up: torch.Tensor, prefill_rows: int) -> torch.Tensor | RoundedRows:
        """Quantized weights with the C kernels take their SwiGLU from the kernels too (the fused decode
        step's, ``activation.c``), rounded for the down projection where it takes its rows so
        (``Linear.takes_rounded``); dense weights keep torch's, which matches transformers' bits."""
        quantized = self.gate_up_proj.quantized
        kernels = None if quantized is None else quantized.kernels
        if kernels is not None and self.activation == "silu" and gate_up.dtype == torch.float32 and gate_up.is_cpu:
            if self.down_proj.takes_rounded(prefill_rows):
                return kernels.silu_and_mul_rounded(gate_up)
            return kernels.silu_and_mul(gate_up)
        return self.act_and_mul(gate_up)
