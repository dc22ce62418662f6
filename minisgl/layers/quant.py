"""Weight-only quantized matrices for ``Linear`` (and the embedding), run by the engine's C kernels
on the CPU. A quantized layer holds only its quantized form: no dense copy of the model is kept.

Decode reads every weight once per step, so its speed is the weights' bytes: int4 is ~0.6 byte per
weight (with its group scales) against fp32's 4. Two formats:

- ``Int4Weight``: 4-bit codes with an fp16 scale and minimum per group of 32 input columns,
  w = q * scale + minimum: GGUF's Q4_0, Q4_1 and Q4_K store exactly this.
- ``Int8Weight``: 8-bit symmetric codes with one scale per output row.

Two product paths, chosen by the number of rows (``max_kernel_rows``: ``minisgl/tuning.py``'s
crossovers, measured by ``benchmarks/many_rows.py``):

- few rows (decode): ``minisgl/kernels/cpu/quant_gemm.c`` multiplies them with fp32 rows (integer
  dot products with AVX-512 VNNI, AVX-VNNI or AVX2, as llama.cpp does). Without it, torch's own CPU
  kernels run instead (``aten._weight_int4pack_mm_for_cpu`` / ``_weight_int8pack_mm``: bf16
  activations and two casts a product), their packed copies made on first use.
- many rows (prefill, large decode batches): the weight is expanded to bf16 a band of output rows at
  a time into one ``DequantBuffer`` shared by every layer (``dequantize.c``, or torch without the C
  kernels), and torch's bf16 GEMM runs on it (oneDNN, which uses AMX where the CPU has it): there
  the arithmetic sets the time, and bf16 GEMM is several times fp32's.

Off the CPU the loader keeps dense dequantized weights instead (``dequantize``).
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.kernels.native import CpuKernels, Int4Buffers, Matmul
from minisgl.tuning import INT4_MAX_KERNEL_ROWS, INT8_MAX_KERNEL_ROWS

QuantMode = Literal["int4", "int8"]
INT4_GROUP = 32  # GGUF's block size for Q4_0/Q4_1 and Q4_K's sub-blocks
INT4_BLOCK = 2 * INT4_GROUP  # the C kernel's unit: two groups' codes in 32 bytes
_QUANTIZE_BAND = 4096  # rows of a weight rounded to int8 at once (bounds the fp32 temporaries)
_INT4_INNER_K_TILES = 2  # torch's int4 packing's tile parameter (2, 4 or 8; 2 divides every K that is a multiple of 32)


def _int4_columns() -> torch.Tensor:
    """Column of each of a 64-column block's 64 nibbles in the C kernel's layout: the 32 low nibbles
    then the 32 high ones, four columns of one group per 32-bit lane, groups alternating by lane
    (``quant_gemm.c``)."""
    j = torch.arange(INT4_BLOCK)
    lane, b = j // 4, j % 4
    return (lane % 2) * INT4_GROUP + (lane // 2) * 4 + b


INT4_COLUMNS = _int4_columns()
INT4_NIBBLES = torch.argsort(INT4_COLUMNS)  # inverse: the nibble of each column


class DequantBuffer:
    """The bf16 buffer that the many-row products of every quantized weight expand their weight into,
    a band of output rows at a time: what those products add to memory is its size, not the model's."""

    def __init__(self, elements: int) -> None:
        if elements < 1:
            raise ValueError(f"a dequantization buffer needs at least one element, got {elements}")
        self.data = torch.empty(elements, dtype=torch.bfloat16)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def band(self, rows: int, columns: int) -> torch.Tensor:
        """A [rows, columns] view (rows * columns must fit)."""
        return self.data[: rows * columns].view(rows, columns)


class QuantizedWeight(nn.Module):
    """A [out, in] weight held in a kernel's packed format; ``forward(x)`` is x W^T."""

    max_kernel_rows: int
    out_features: int
    in_features: int
    buffer: DequantBuffer | None = None  # set by the loader: shared by the model's quantized weights
    # The engine's C kernels (``DecoderForCausalLM.use_kernels``), set before the first product; None: torch's.
    kernels: CpuKernels | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """On the CPU: the kernels for at most ``max_kernel_rows`` rows, bf16 GEMM on the expanded
        weight beyond."""
        rows = x.reshape(-1, self.in_features)
        y = self.kernel(rows) if rows.shape[0] <= self.max_kernel_rows else self.many_rows(rows)
        if y.dtype == x.dtype and x.dim() == 2:  # the decode step's case: nothing to reshape or cast
            return y
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        """[rows, in] → [rows, out], fp32 from the C kernels, bf16 from torch's."""
        raise NotImplementedError

    def many_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """[rows, in] → [rows, out] bf16: the weight expanded to bf16 band by band, then bf16 GEMM."""
        n, k = self.out_features, self.in_features
        buffer = self.buffer if self.buffer is not None else DequantBuffer(n * k)  # a weight on its own
        band = min(n, buffer.data.numel() // k)
        if band < 1:
            raise ValueError(f"dequantization buffer of {buffer.data.numel()} elements holds no row of {k}")
        x = rows.to(torch.bfloat16)
        if band == n:
            w = buffer.band(n, k)
            self.expand(0, w)
            return F.linear(x, w)
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        for start in range(0, n, band):
            w = buffer.band(min(band, n - start), k)
            self.expand(start, w)
            y[:, start : start + len(w)] = F.linear(x, w)
        return y

    def expand(self, start: int, out: torch.Tensor) -> None:
        """Output rows ``start .. start + len(out)`` dequantized into ``out`` ([rows, in] bf16)."""
        raise NotImplementedError

    def lookup(self, ids: torch.Tensor | slice) -> torch.Tensor:
        """The dequantized fp32 rows ``ids`` (an embedding's lookup)."""
        raise NotImplementedError

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.lookup(slice(None)).to(dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class Int4Weight(QuantizedWeight):
    # The integer kernel streams the weight once per 4 rows, so its time grows with every row; past
    # this many the bf16 expansion and GEMM win.
    max_kernel_rows = INT4_MAX_KERNEL_ROWS

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> None:
        """``codes``: [out, in / 2] uint8 in the C kernel's layout (``from_codes`` builds it);
        ``scale``, ``minimum``: [out, in / 32] fp16. What ``state_dict`` holds."""
        super().__init__()
        self.out_features, self.in_features = codes.shape[0], codes.shape[1] * 2
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.register_buffer("minimum", minimum)

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> Int4Weight:
        """``codes``: [out, in] integers in 0..15; ``scale``, ``minimum``: [out, in / 32], so that
        w = codes * scale + minimum, group by group (fp16 scales: exact for GGUF's own)."""
        out_features, in_features = codes.shape
        if in_features % INT4_BLOCK or scale.shape != (out_features, in_features // INT4_GROUP):
            raise ValueError(
                f"int4 needs a multiple of {INT4_BLOCK} input columns and a scale per {INT4_GROUP}: "
                f"weight {tuple(codes.shape)}, scales {tuple(scale.shape)}"
            )
        scale16, minimum16 = scale.to(torch.float16), minimum.to(torch.float16)
        if not (scale16.isfinite().all() and minimum16.isfinite().all()):
            raise ValueError("int4 scales or minimums out of fp16's range")
        blocks = codes.to(torch.uint8).view(out_features, -1, INT4_BLOCK)[:, :, INT4_COLUMNS]
        packed = blocks[..., : INT4_BLOCK // 2] | (blocks[..., INT4_BLOCK // 2 :] << 4)
        return cls(packed.reshape(out_features, -1).contiguous(), scale16.contiguous(), minimum16.contiguous())

    @classmethod
    def from_groups(cls, w: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> Int4Weight:
        """The codes of ``w`` on a given grid w = scale * q + minimum (a GGUF file's, or ``rtn_groups``):
        exact when ``w`` was dequantized from that grid."""
        scale, minimum = scale.half().float(), minimum.half().float()  # the grid the kernel will use
        inverse = torch.where(scale == 0, 0.0, 1 / scale)  # an all-equal group: every code 0
        q = (_groups(w) - minimum.unsqueeze(-1)).mul_(inverse.unsqueeze(-1)).round_().clamp_(0, 15)
        return cls.from_codes(q.view(w.shape), scale, minimum)

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Int4Weight:
        """Round-to-nearest per group of 32: the group's minimum and (max - min) / 15 as scale."""
        return cls.from_groups(w, *rtn_groups(w))

    @classmethod
    def empty(cls, out_features: int, in_features: int) -> Int4Weight:
        """An [out, in] weight to be filled (``rows_view``)."""
        groups = in_features // INT4_GROUP
        return cls(
            torch.empty(out_features, in_features // 2, dtype=torch.uint8),
            torch.empty(out_features, groups, dtype=torch.float16),
            torch.empty(out_features, groups, dtype=torch.float16),
        )

    def rows_view(self, start: int, end: int) -> Int4Buffers:
        """(codes, scale, minimum) of output rows ``start .. end``, views to write them through."""
        return self.codes[start:end], self.scale[start:end], self.minimum[start:end]

    def rows(self, start: int, end: int) -> Int4Weight:
        """Output rows ``start .. end``, copied (a view would keep the whole weight alive)."""
        return Int4Weight(self.codes[start:end].clone(), self.scale[start:end].clone(), self.minimum[start:end].clone())

    def columns(self, start: int, end: int) -> Int4Weight:
        """Input columns ``start .. end``: whole 64-column blocks of the kernel's layout."""
        if start % INT4_BLOCK or end % INT4_BLOCK:
            raise ValueError(f"columns {start}:{end} split a block of {INT4_BLOCK} int4 weights")
        g0, g1 = start // INT4_GROUP, end // INT4_GROUP
        return Int4Weight(self.codes[:, start // 2 : end // 2].contiguous(), self.scale[:, g0:g1].contiguous(), self.minimum[:, g0:g1].contiguous())

    @staticmethod
    def cat(parts: list[Int4Weight]) -> Int4Weight:
        """The parts' rows one after another (a fused projection)."""
        if len(parts) == 1:
            return parts[0]
        return Int4Weight(*(torch.cat([getattr(p, name) for p in parts]) for name in ("codes", "scale", "minimum")))

    def unpacked_codes(self, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """[len(rows), in] codes 0..15 in column order (every row by default)."""
        packed = self.codes[rows]
        blocks = packed.view(packed.shape[0], -1, INT4_BLOCK // 2)
        nibbles = torch.cat([blocks & 0xF, blocks >> 4], dim=-1)  # per block: low nibbles, then high
        return nibbles[:, :, INT4_NIBBLES].reshape(packed.shape[0], self.in_features)

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        if self._c_matmul is not None:
            return self._c_matmul(rows.float().contiguous())
        packed, scales_and_zeros = self._torch_packing
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16), packed, INT4_GROUP, scales_and_zeros)

    @cached_property
    def _c_matmul(self) -> Matmul | None:
        kernels = self.kernels
        return None if kernels is None else kernels.int4(self.codes, self.scale, self.minimum)

    @cached_property
    def _torch_packing(self) -> tuple[torch.Tensor, torch.Tensor]:
        """torch's packed codes and its [in / 32, out, 2] bf16 (scale, zero), w = (q - 8) * scale + zero."""
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            self.unpacked_codes().to(torch.int32).contiguous(), _INT4_INNER_K_TILES
        )
        scale, minimum = self.scale.float(), self.minimum.float()
        pairs = torch.stack([scale, minimum + 8 * scale], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        return packed, pairs

    def lookup(self, ids: torch.Tensor | slice) -> torch.Tensor:
        codes = self.unpacked_codes(ids)
        groups = codes.view(codes.shape[0], -1, INT4_GROUP).float()
        w = groups * self.scale[ids].float().unsqueeze(-1) + self.minimum[ids].float().unsqueeze(-1)
        return w.view(codes.shape[0], self.in_features)

    def expand(self, start: int, out: torch.Tensor) -> None:
        kernels = self.kernels
        if kernels is not None:
            kernels.int4_dequantize(self.codes, self.scale, self.minimum, start, out)
        else:
            out.copy_(self.lookup(slice(start, start + len(out))))


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
    max_kernel_rows = INT8_MAX_KERNEL_ROWS  # the integer kernel beats the bf16 path up to here

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor) -> None:
        """``codes``: [out, in] int8; ``scale``: [out]; w = codes * scale row by row."""
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.register_buffer("codes", codes.to(torch.int8).contiguous())
        self.register_buffer("scale", scale.float().contiguous())

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Int8Weight:
        """Symmetric round-to-nearest per output row (torch's kernel has one scale per row), a band of
        rows at a time: a vocabulary-sized weight's fp32 temporaries would otherwise double its size."""
        codes = torch.empty(w.shape, dtype=torch.int8)
        scale = torch.empty(w.shape[0])
        for start in range(0, w.shape[0], _QUANTIZE_BAND):
            band = w[start : start + _QUANTIZE_BAND].float()
            step = band.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
            codes[start : start + len(band)] = (band / step.unsqueeze(1)).round_().clamp_(-127, 127)
            scale[start : start + len(band)] = step
        return cls(codes, scale)

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        if self._c_matmul is not None:
            return self._c_matmul(rows.float().contiguous())
        # bf16 activations (and so scales): the torch kernel's fp32 path measured 10-100x slower past one row.
        return torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16), self.codes, self._bf16_scale)

    @cached_property
    def _c_matmul(self) -> Matmul | None:
        kernels = self.kernels if self.in_features % INT4_GROUP == 0 else None
        return None if kernels is None else kernels.int8(self.codes, self.scale)

    @cached_property
    def _bf16_scale(self) -> torch.Tensor:
        return self.scale.to(torch.bfloat16)

    def lookup(self, ids: torch.Tensor | slice) -> torch.Tensor:
        return self.codes[ids].float() * self.scale[ids].unsqueeze(1)

    def expand(self, start: int, out: torch.Tensor) -> None:
        kernels = self.kernels if self.in_features % 16 == 0 else None
        if kernels is not None:
            kernels.int8_dequantize(self.codes, self.scale, start, out)
        else:
            out.copy_(self.lookup(slice(start, start + len(out))))


WEIGHT_CLASSES: dict[str, type[QuantizedWeight]] = {"Int4Weight": Int4Weight, "Int8Weight": Int8Weight}


def quantize_weight(w: torch.Tensor, mode: QuantMode) -> QuantizedWeight:
    """Round-to-nearest quantization of a dense [out, in] weight."""
    if mode == "int4":
        return Int4Weight.quantize(w)
    return Int8Weight.quantize(w)
