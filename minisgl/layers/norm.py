from __future__ import annotations

import torch
from torch import nn

from minisgl.kernels.native import CpuKernels, RoundedRows


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back, with Hugging Face's order of operations. fp32 on
    the CPU runs one C call (torch's ``rms_norm`` is seven ops: 17 us against 7 us at one row, and a
    decode step runs 61 norms); other dtypes round to their own before the weight, as Hugging Face does.

    ``add_forward`` also adds the residual first: the decoder's x + sublayer(x) followed by the
    next norm, in one call. ``add_forward_rounded`` hands its output to a quantized product rounded
    (``RoundedRows``) instead of in fp32.

    ``unit_offset`` (Gemma): the checkpoint stores gain - 1, and the product with the gain
    (1 + weight, in float32) is taken before the cast back, as Gemma's RMSNorm does."""

    kernels: CpuKernels | None = None  # the engine's (``DecoderForCausalLM.use_kernels``); None: torch's ops

    def __init__(self, size: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size) if unit_offset else torch.ones(size))
        self.eps = eps
        self.shape = (size,)
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = self._kernels(x)
        if kernels is not None:
            return kernels.rms_norm(x.contiguous(), self.gain(), self.eps)[0]
        if self.unit_offset:
            return (torch.rms_norm(x.float(), self.shape, eps=self.eps) * self.gain()).to(x.dtype)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return torch.rms_norm(x, self.shape, self.weight, self.eps)
        return self.weight * torch.rms_norm(x.float(), self.shape, eps=self.eps).to(x.dtype)

    def add_forward(self, delta: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + delta), residual + delta)."""
        kernels = self._kernels(residual)
        if kernels is not None:
            return kernels.rms_norm(residual.contiguous(), self.gain(), self.eps, delta.contiguous())
        total = residual + delta
        return self(total), total

    def add_forward_rounded(
        self, delta: torch.Tensor | None, residual: torch.Tensor
    ) -> tuple[RoundedRows, torch.Tensor] | None:
        """``add_forward``'s (or, without ``delta``, the norm of ``residual`` and ``residual``) with the
        normed rows rounded for a quantized product, in one C call; None where the C kernels do not run
        this norm on these rows (2-D fp32, a multiple of 32 columns)."""
        kernels = self._kernels(residual)
        if kernels is None or residual.dim() != 2 or residual.shape[1] % 32:
            return None
        if delta is None:
            return kernels.rms_norm_rounded(residual.contiguous(), self.gain(), self.eps)[0], residual
        return kernels.rms_norm_rounded(residual.contiguous(), self.gain(), self.eps, delta.contiguous())

    def gain(self) -> torch.Tensor:
        """What the normalised values are multiplied by (float32 with a unit offset)."""
        return 1.0 + self.weight.float() if self.unit_offset else self.weight

    def _kernels(self, x: torch.Tensor) -> CpuKernels | None:
        fp32 = x.dtype == torch.float32 and self.weight.dtype == torch.float32
        return self.kernels if fp32 and x.is_cpu else None
