"""Weight-only quantized matrices for ``Linear``, run by torch's CPU kernels.

Decode reads every weight once per step, so its speed is the weights' bytes: int4 is ~0.6 byte per
weight (with its group scales) against fp32's 4. Two formats, one per kernel torch ships for CPU:

- ``Int4Weight``: 4-bit codes with a scale and a zero per group of 32 input columns,
  w = (q - 8) * scale + zero (``aten._weight_int4pack_mm_for_cpu``; bf16 activations, bf16 scales).
  GGUF's Q4_0, Q4_1 and Q4_K store exactly this (w = d*q + m is (q - 8)*d + (m + 8d)).
- ``Int8Weight``: 8-bit symmetric codes with one scale per output row (``aten._weight_int8pack_mm``).

Both kernels only pay off for a few rows (measured in issue #13 on SmolLM2's shapes: int4 12x
faster than fp32 at 1 row, 3x at 16, 1.5x at 64; int8 4x at 1 row, slower past 16). Beyond
``max_kernel_rows`` (prefill) ``Linear`` runs its dense weight, which it keeps for that.
Off the CPU the loader keeps dense dequantized weights instead (``dequantize``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

QuantMode = Literal["int4", "int8"]
INT4_GROUP = 32  # GGUF's block size for Q4_0/Q4_1 and Q4_K's sub-blocks
_INT4_INNER_K_TILES = 2  # the CPU packing's tile parameter (2, 4 or 8; 2 divides every K that is a multiple of 32)


class QuantizedWeight(nn.Module):
    """A [out, in] weight held in a kernel's packed format; ``forward(x)`` is x W^T."""

    max_kernel_rows: int
    out_features: int
    in_features: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """On the CPU, for at most ``max_kernel_rows`` rows (``Linear`` runs more on its dense weight)."""
        rows = x.reshape(-1, x.shape[-1])
        return self.kernel(rows).to(x.dtype).view(*x.shape[:-1], self.out_features)

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class Int4Weight(QuantizedWeight):
    max_kernel_rows = 64

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, nibbles: torch.Tensor) -> None:
        """The kernel's packed codes, its [in / 32, out, 2] bf16 (scale, zero) and the codes two per
        byte ([out, in / 2], for the dense path): what ``from_codes`` builds and ``state_dict`` holds."""
        super().__init__()
        self.out_features, self.in_features = nibbles.shape[0], nibbles.shape[1] * 2
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("nibbles", nibbles)

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> Int4Weight:
        """``codes``: [out, in] integers in 0..15; ``scale``, ``zero``: [out, in / 32], so that
        w = (codes - 8) * scale + zero, group by group."""
        out_features, in_features = codes.shape
        if in_features % INT4_GROUP or scale.shape != (out_features, in_features // INT4_GROUP):
            raise ValueError(
                f"int4 needs groups of {INT4_GROUP} input columns: weight {tuple(codes.shape)}, scales {tuple(scale.shape)}"
            )
        q = codes.to(torch.int32).contiguous()
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, _INT4_INNER_K_TILES)
        # The kernel takes [groups, out, 2] (scale, zero) in the activations' dtype, bf16.
        scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        # Kept for the dense path (prefill, other devices): half a byte per weight, two codes a byte.
        nibbles = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
        return cls(packed, scales_and_zeros, nibbles)

    @classmethod
    def from_groups(cls, w: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> Int4Weight:
        """The codes of ``w`` on a given grid w = scale * q + minimum (a GGUF file's, or ``rtn_groups``):
        exact when ``w`` was dequantized from that grid."""
        scale, minimum = scale.float(), minimum.float()
        inverse = torch.where(scale == 0, 0.0, 1 / scale)  # an all-equal group: every code 0
        q = (_groups(w) - minimum.unsqueeze(-1)).mul_(inverse.unsqueeze(-1)).round_().clamp_(0, 15)
        return cls.from_codes(q.view(w.shape), scale, minimum + 8 * scale)

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Int4Weight:
        """Round-to-nearest per group of 32: the group's minimum and (max - min) / 15 as scale."""
        return cls.from_groups(w, *rtn_groups(w))

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows.to(torch.bfloat16), self.packed, INT4_GROUP, self.scales_and_zeros
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        codes = torch.stack([self.nibbles & 0xF, self.nibbles >> 4], dim=-1).view(self.out_features, -1, INT4_GROUP)
        scale, zero = self.scales_and_zeros.to(dtype).transpose(0, 1).unbind(-1)
        w = (codes.to(dtype) - 8) * scale.unsqueeze(-1) + zero.unsqueeze(-1)
        return w.view(self.out_features, self.in_features)


def _groups(w: torch.Tensor) -> torch.Tensor:
    if w.dim() != 2 or w.shape[1] % INT4_GROUP:
        raise ValueError(f"int4 needs a 2-d weight with a multiple of {INT4_GROUP} input columns, got {tuple(w.shape)}")
    return w.float().view(w.shape[0], -1, INT4_GROUP)


def rtn_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and minimum of each group of 32 input columns for round-to-nearest int4."""
    groups = _groups(w)
    lo, hi = groups.amin(-1), groups.amax(-1)
    return (hi - lo) / 15, lo


class Int8Weight(QuantizedWeight):
    max_kernel_rows = 16

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor) -> None:
        """``codes``: [out, in] int8; ``scale``: [out]; w = codes * scale row by row."""
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.register_buffer("codes", codes.to(torch.int8).contiguous())
        # bf16 activations (and so scales): the kernel's fp32 path measured 10-100x slower past one row.
        self.register_buffer("scale", scale.to(torch.bfloat16))

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Int8Weight:
        """Symmetric round-to-nearest per output row (the kernel has one scale per row)."""
        scale = w.float().abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        return cls((w.float() / scale.unsqueeze(1)).round().clamp(-127, 127), scale)

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16), self.codes, self.scale)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.codes.to(dtype) * self.scale.to(dtype).unsqueeze(1)


WEIGHT_CLASSES: dict[str, type[QuantizedWeight]] = {"Int4Weight": Int4Weight, "Int8Weight": Int8Weight}


def quantize_weight(w: torch.Tensor, mode: QuantMode) -> QuantizedWeight:
    """Round-to-nearest quantization of a dense [out, in] weight."""
    if mode == "int4":
        return Int4Weight.quantize(w)
    return Int8Weight.quantize(w)
