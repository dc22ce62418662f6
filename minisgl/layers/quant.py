"""Weight-only quantized matrices for ``Linear`` (and the embedding), run by the engine's C kernels
on the CPU. A quantized layer holds only its quantized form: no dense copy of the model is kept.

Decode reads every weight once per step, so its speed is the weights' bytes: int4 is ~0.6 byte per
weight (with its group scales) against fp32's 4. Two formats:

- ``Int4Weight``: 4-bit codes with an fp16 scale and minimum per group of 32 input columns,
  w = q * scale + minimum: GGUF's Q4_0, Q4_1 and Q4_K store exactly this.
- ``Int8Weight``: 8-bit symmetric codes with one scale per output row.

Both are stored in tiles of 16 output rows (kernels.h's Int4 / Int8): ``minisgl/kernels/cpu/quant_gemm.c``
multiplies them with fp32 rows at every row count, decode and prefill alike (integer dot products with
AVX-512 VNNI, AVX-VNNI or AVX2, as llama.cpp does; x rounded to one int8 digit per group of 32, as
llama.cpp rounds it, or to two in the products of a weight whose ``digits`` is 2: the LM head's), each
row the same whatever the batch. With the kernels' amx build the rows of prefill tokens take bf16 products on
AMX instead (``bf16_gemm.c``; ``forward``'s ``prefill_rows``), decode rows still the integer ones (from 9 rows,
their integer sums on AMX-INT8: the same bits): a row's path follows its kind, never its batch. Without the C
kernels, torch's run instead: its weight-only kernels (``aten._weight_int4pack_mm_for_cpu`` /
``_weight_int8pack_mm``: bf16 activations, their packed copies made on first use) for up to
``max_kernel_rows`` rows (``minisgl/tuning.py``, measured by ``benchmarks/many_rows.py``), and past them
the weight expanded to bf16 a band of output rows at a time into one ``DequantBuffer`` shared by every
layer, then torch's bf16 GEMM (oneDNN, which uses AMX where the CPU has it).

Off the CPU the loader keeps dense dequantized weights instead (``dequantize``).
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.heap import HugePageArena
from minisgl.kernels.native import QUANT_TILE, CpuKernels, Int4Buffers, Int8Buffers, Matmul, RoundedRows
from minisgl.tuning import INT4_MAX_KERNEL_ROWS, INT8_MAX_KERNEL_ROWS

QuantMode = Literal["int4", "int8"]
INT4_GROUP = 32  # GGUF's block size for Q4_0/Q4_1 and Q4_K's sub-blocks
_QUANTIZE_BAND = 4096  # rows of a weight rounded to int8 at once (bounds the fp32 temporaries)
_INT4_INNER_K_TILES = 2  # torch's int4 packing's tile parameter (2, 4 or 8; 2 divides every K that is a multiple of 32)


class DequantBuffer:
    """The bf16 buffer that torch's many-row products (no C kernels) expand every quantized weight into,
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
    # int8 digits of x per group of 32 in the C kernels' products, set with ``kernels``: one (llama.cpp's
    # rounding, half the dot products of two) but in the LM head's (``DecoderForCausalLM.use_kernels``).
    digits: int = 1

    def forward(
        self, x: torch.Tensor | RoundedRows, prefill_rows: int = 0, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """On the CPU: the C kernels at every row count, x rounded to ``digits`` int8 digits per group of
        32 (or rounded already, where ``takes_rounded``), but for the first ``prefill_rows`` rows (prefill
        tokens) where the kernels have a tile unit's path for them (bf16 products: ``CpuKernels.int4``);
        without the C kernels torch's kernels for at most ``max_kernel_rows`` rows, bf16 GEMM on the expanded
        weight beyond. Written into ``out`` where given (x's shape but the last dimension): in place by the C
        kernels where it is a contiguous fp32 [rows, out], copied there otherwise."""
        in_place = out is not None and out.dtype == torch.float32 and out.dim() == 2 and out.is_contiguous()
        if isinstance(x, RoundedRows):
            if self.c_matmul is None:
                raise ValueError("rounded rows need the C kernels' products")
            y = self.c_matmul(x, prefill_rows, out if in_place else None)
            return y if out is None or in_place else out.copy_(y.view(out.shape))
        rows = x.reshape(-1, self.in_features)
        if self.c_matmul is not None:
            if in_place:
                return self.c_matmul(rows.float().contiguous(), prefill_rows, out)  # written in place
            y = self.c_matmul(rows.float().contiguous(), prefill_rows)
        elif rows.shape[0] <= self.max_kernel_rows:
            y = self.kernel(rows)
        else:
            y = self.many_rows(rows)
        if out is not None:
            return out.copy_(y.view(out.shape))
        if y.dtype == x.dtype and x.dim() == 2:  # the decode step's case: nothing to reshape or cast
            return y
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def takes_rounded(self, prefill_rows: int) -> bool:
        """Whether ``forward`` takes rows that the layer computing them rounded (``RoundedRows``) for a
        pass with ``prefill_rows`` prefill rows: the C kernels' one-digit products of whole groups, where
        no prefill row takes the tile unit's bf16 path (which reads fp32 rows)."""
        kernels = self.kernels
        if kernels is None or self.digits != 1 or self.in_features % INT4_GROUP:
            return False
        return not (prefill_rows and kernels.bf16_prefill)

    @cached_property
    def c_matmul(self) -> Matmul | None:
        """The C kernels' product, [rows, in] fp32 → [rows, out] fp32; None without them."""
        return None if self.kernels is None else self.bind(self.kernels, self.digits)

    def bind(self, kernels: CpuKernels, digits: int) -> Matmul:
        """This weight's product through ``kernels``, x rounded to ``digits`` int8 digits."""
        raise NotImplementedError

    def kernel_buffers(self) -> Int4Buffers | Int8Buffers | None:
        """This weight's buffers as the C kernels' whole-layer entry points take them (kernels.h's
        Projection: ``decode_layer.c``, ``mlp_bf16``), where they take this one."""
        return None

    def move_into(self, arena: HugePageArena) -> None:
        """Every buffer of this weight moved into ``arena`` (its values unchanged; the old ones dropped
        one by one as they are copied), before any product is bound (``bind`` reads the addresses)."""
        for name in [name for name, _ in self.named_buffers(recurse=False)]:
            setattr(self, name, arena.place(getattr(self, name)))

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        """[rows, in] → [rows, out] bf16 through torch's weight-only kernel (bf16 activations)."""
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
        out.copy_(self.lookup(slice(start, start + len(out))))

    def lookup(self, ids: torch.Tensor | slice) -> torch.Tensor:
        """The dequantized fp32 rows ``ids`` (an embedding's lookup)."""
        raise NotImplementedError

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.lookup(slice(None)).to(dtype)

    def _row_index(self, rows: torch.Tensor | slice) -> tuple[torch.Tensor, torch.Tensor]:
        """The tile and the lane in it of each of ``rows`` (ids or a slice of the output rows)."""
        ids = torch.arange(self.out_features)[rows] if isinstance(rows, slice) else rows
        return ids // QUANT_TILE, ids % QUANT_TILE

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class Int4Weight(QuantizedWeight):
    max_kernel_rows = INT4_MAX_KERNEL_ROWS  # torch's kernel's crossover (without the C kernels)

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, out_features: int) -> None:
        """An [out_features, in] weight in the C kernel's tiles of ``QUANT_TILE`` output rows (kernels.h's
        Int4; ``from_codes`` builds them): ``codes`` [tiles, 8 in] uint8, ``scale`` and ``minimum``
        [tiles, in / 2] fp16, the last tile's rows past ``out_features`` zero. What ``state_dict`` holds."""
        super().__init__()
        self.out_features, self.in_features = out_features, codes.shape[1] // 8
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.register_buffer("minimum", minimum)

    @property
    def groups(self) -> int:
        return self.in_features // INT4_GROUP

    @classmethod
    def empty(cls, out_features: int, in_features: int, arena: HugePageArena | None = None) -> Int4Weight:
        """An [out, in] weight to be filled, every row of it (``write_rows``), its buffers in ``arena``
        where given: only the last tile, where rows past ``out_features`` must stay zero, is zeroed now
        (the rest would be written twice)."""
        tiles = -(-out_features // QUANT_TILE)
        codes = _empty((tiles, in_features * 8), torch.uint8, arena)
        scale, minimum = (_empty((tiles, in_features // 2), torch.float16, arena) for _ in range(2))
        for buffer in (codes, scale, minimum):
            buffer[-1:].zero_()
        return cls(codes, scale, minimum, out_features)

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> Int4Weight:
        """``codes``: [out, in] integers in 0..15; ``scale``, ``minimum``: [out, in / 32], so that
        w = codes * scale + minimum, group by group (fp16 scales: exact for GGUF's own)."""
        out_features, in_features = codes.shape
        if in_features % INT4_GROUP or scale.shape != (out_features, in_features // INT4_GROUP):
            raise ValueError(
                f"int4 needs a multiple of {INT4_GROUP} input columns and a scale per {INT4_GROUP}: "
                f"weight {tuple(codes.shape)}, scales {tuple(scale.shape)}"
            )
        scale16, minimum16 = scale.to(torch.float16), minimum.to(torch.float16)
        if not (scale16.isfinite().all() and minimum16.isfinite().all()):
            raise ValueError("int4 scales or minimums out of fp16's range")
        # Per group, byte j: column j in its low nibble, j + 16 in its high one (GGUF's Q4_0 bytes).
        halves = codes.to(torch.uint8).view(out_features, -1, 2, INT4_GROUP // 2)
        words = (halves[:, :, 0] | (halves[:, :, 1] << 4)).contiguous().view(torch.int32)
        weight = cls.empty(out_features, in_features)
        weight.write_rows(0, words, scale16, minimum16)
        return weight

    def write_rows(self, start: int, words: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> None:
        """Rows ``start .. start + len(words)`` written into the tiles: ``words`` [rows, in / 32, 4]
        int32, each row's 16 code bytes per group (GGUF's Q4_0 / Q4_1 layout); ``scale``, ``minimum``
        [rows, in / 32] fp16."""
        end = start + len(words)
        if not 0 <= start <= end <= self.out_features:
            raise ValueError(f"rows {start}..{end} outside the weight's {self.out_features}")
        codes, scales, minimums = self._tile_views()
        first, last = min(-(-start // QUANT_TILE) * QUANT_TILE, end), max(end // QUANT_TILE * QUANT_TILE, start)
        if first < last:  # whole tiles: one strided copy each
            t0, t1, a, b = first // QUANT_TILE, last // QUANT_TILE, first - start, last - start
            codes[t0:t1] = words[a:b].reshape(t1 - t0, QUANT_TILE, -1, 4).permute(0, 2, 3, 1)
            scales[t0:t1] = scale[a:b].reshape(t1 - t0, QUANT_TILE, -1).transpose(1, 2)
            minimums[t0:t1] = minimum[a:b].reshape(t1 - t0, QUANT_TILE, -1).transpose(1, 2)
        for row in [*range(start, first), *range(max(first, last), end)]:  # parts of tiles shared with other rows
            tile, lane = divmod(row, QUANT_TILE)
            codes[tile, :, :, lane] = words[row - start]
            scales[tile, :, lane], minimums[tile, :, lane] = scale[row - start], minimum[row - start]

    def _tile_views(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Code words [tiles, groups, 4, TILE] int32, scales and minimums [tiles, groups, TILE]."""
        tiles = len(self.codes)
        return (
            self.codes.view(torch.int32).view(tiles, self.groups, 4, QUANT_TILE),
            self.scale.view(tiles, self.groups, QUANT_TILE),
            self.minimum.view(tiles, self.groups, QUANT_TILE),
        )

    def group_scales(self, rows: torch.Tensor | slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """[len(rows), in / 32] fp16 scales and minimums, row by row (every row by default)."""
        _, scales, minimums = self._tile_views()
        tile, lane = self._row_index(rows)
        return scales[tile, :, lane], minimums[tile, :, lane]

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

    def rows(self, start: int, end: int) -> Int4Weight:
        """Output rows ``start .. end``, copied (a view would keep the whole weight alive)."""
        if start % QUANT_TILE == 0 and (end % QUANT_TILE == 0 or end == self.out_features):  # whole tiles
            t0, t1 = start // QUANT_TILE, -(-end // QUANT_TILE)
            parts = (self.codes[t0:t1].clone(), self.scale[t0:t1].clone(), self.minimum[t0:t1].clone())
            return Int4Weight(*parts, end - start)
        ids = torch.arange(start, end)
        return Int4Weight.from_codes(self.unpacked_codes(ids), *self.group_scales(ids))

    def columns(self, start: int, end: int) -> Int4Weight:
        """Input columns ``start .. end``: whole groups of 32."""
        if start % INT4_GROUP or end % INT4_GROUP:
            raise ValueError(f"columns {start}:{end} split a group of {INT4_GROUP} int4 weights")
        g0, g1 = start // INT4_GROUP, end // INT4_GROUP
        codes, scales, minimums = self._tile_views()
        tiles = len(self.codes)
        return Int4Weight(
            codes[:, g0:g1].contiguous().view(torch.uint8).view(tiles, -1),
            scales[:, g0:g1].reshape(tiles, -1).contiguous(),
            minimums[:, g0:g1].reshape(tiles, -1).contiguous(),
            self.out_features,
        )

    @staticmethod
    def cat(parts: list[Int4Weight]) -> Int4Weight:
        """The parts' rows one after another (a fused projection)."""
        if len(parts) == 1:
            return parts[0]
        if all(p.out_features % QUANT_TILE == 0 for p in parts[:-1]):  # tiles one after another
            buffers = (torch.cat([getattr(p, name) for p in parts]) for name in ("codes", "scale", "minimum"))
            return Int4Weight(*buffers, sum(p.out_features for p in parts))
        scales = [p.group_scales() for p in parts]
        return Int4Weight.from_codes(
            torch.cat([p.unpacked_codes() for p in parts]),
            torch.cat([s for s, _ in scales]),
            torch.cat([m for _, m in scales]),
        )

    def unpacked_codes(self, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """[len(rows), in] codes 0..15 in column order (every row by default)."""
        codes, _, _ = self._tile_views()
        tile, lane = self._row_index(rows)
        groups = codes[tile, :, :, lane].contiguous().view(torch.uint8)  # [rows, groups, 16]: GGUF's bytes
        return torch.cat([groups & 0xF, groups >> 4], dim=-1).reshape(len(tile), self.in_features)

    def bind(self, kernels: CpuKernels, digits: int) -> Matmul:
        return kernels.int4(self.codes, self.scale, self.minimum, self.out_features, digits)

    def kernel_buffers(self) -> Int4Buffers:
        return self.codes, self.scale, self.minimum

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        packed, scales_and_zeros = self._torch_packing
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16), packed, INT4_GROUP, scales_and_zeros)

    @cached_property
    def _torch_packing(self) -> tuple[torch.Tensor, torch.Tensor]:
        """torch's packed codes and its [in / 32, out, 2] bf16 (scale, zero), w = (q - 8) * scale + zero."""
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            self.unpacked_codes().to(torch.int32).contiguous(), _INT4_INNER_K_TILES
        )
        scale, minimum = (t.float() for t in self.group_scales())
        pairs = torch.stack([scale, minimum + 8 * scale], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        return packed, pairs

    def lookup(self, ids: torch.Tensor | slice) -> torch.Tensor:
        codes = self.unpacked_codes(ids)
        scale, minimum = (t.float().unsqueeze(-1) for t in self.group_scales(ids))
        w = codes.view(codes.shape[0], -1, INT4_GROUP).float() * scale + minimum
        return w.view(codes.shape[0], self.in_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, tiles of {QUANT_TILE} rows"


def _empty(shape: tuple[int, ...], dtype: torch.dtype, arena: HugePageArena | None) -> torch.Tensor:
    """A weight's buffer, not yet written: in ``arena`` where given."""
    return torch.empty(shape, dtype=dtype) if arena is None else arena.empty(shape, dtype)


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
    max_kernel_rows = INT8_MAX_KERNEL_ROWS  # torch's kernel's crossover (without the C kernels)

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, out_features: int, in_features: int) -> None:
        """An [out_features, in_features] weight in the C kernel's tiles of ``QUANT_TILE`` output rows
        (kernels.h's Int8; ``quantize`` builds them), its columns padded with zeros to a multiple of 32:
        ``codes`` [tiles, 16 padded_in] int8, ``scale`` [tiles * 16] fp32, one per row (0 past
        ``out_features``); w = codes * scale row by row. What ``state_dict`` holds."""
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.padded_in = codes.shape[1] // QUANT_TILE
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)

    @classmethod
    def empty(cls, out_features: int, in_features: int, arena: HugePageArena | None = None) -> Int8Weight:
        """An [out, in] weight of zeros, to be filled, its buffers in ``arena`` where given."""
        tiles, padded_in = -(-out_features // QUANT_TILE), -(-in_features // INT4_GROUP) * INT4_GROUP
        codes = _empty((tiles, QUANT_TILE * padded_in), torch.int8, arena).zero_()
        return cls(codes, _empty((tiles * QUANT_TILE,), torch.float32, arena).zero_(), out_features, in_features)

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Int8Weight:
        """Symmetric round-to-nearest per output row (torch's kernel has one scale per row), a band of
        rows at a time: a vocabulary-sized weight's fp32 temporaries would otherwise double its size."""
        out_features, in_features = w.shape
        weight = cls.empty(out_features, in_features)
        padded_in = weight.padded_in
        codes = weight._tile_view()
        for start in range(0, out_features, _QUANTIZE_BAND):  # a multiple of the tile
            band = w[start : start + _QUANTIZE_BAND].float()
            step = band.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
            rows = -(-len(band) // QUANT_TILE) * QUANT_TILE
            band_codes = torch.zeros(rows, padded_in, dtype=torch.int8)
            band_codes[: len(band), :in_features] = (band / step.unsqueeze(1)).round_().clamp_(-127, 127)
            t0 = start // QUANT_TILE
            codes[t0 : t0 + rows // QUANT_TILE] = band_codes.view(
                -1, QUANT_TILE, padded_in // INT4_GROUP, 8, 4
            ).permute(0, 2, 3, 1, 4)
            weight.scale[start : start + len(band)] = step
        return weight

    def _tile_view(self) -> torch.Tensor:
        """The codes as [tiles, groups, 8, TILE, 4]: per group, 8 vectors of each row's 4 bytes."""
        return self.codes.view(len(self.codes), self.padded_in // INT4_GROUP, 8, QUANT_TILE, 4)

    def row_codes(self, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """[len(rows), in] int8 codes in column order (every row by default)."""
        tile, lane = self._row_index(rows)
        codes = self._tile_view()[tile, :, :, lane, :]  # [rows, groups, 8, 4]
        return codes.reshape(len(tile), self.padded_in)[:, : self.in_features]

    def kernel_buffers(self) -> Int8Buffers | None:
        return (self.codes, self.scale) if self.padded_in == self.in_features else None  # they read whole groups

    def bind(self, kernels: CpuKernels, digits: int) -> Matmul:
        matmul = kernels.int8(self.codes, self.scale, self.out_features, digits)
        pad = self.padded_in - self.in_features
        if pad == 0:
            return matmul

        def padded(x: torch.Tensor, prefill_rows: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
            return matmul(F.pad(x, (0, pad)), prefill_rows, out)  # the kernel reads whole groups

        return padded

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        # bf16 activations (and so scales): the torch kernel's fp32 path measured 10-100x slower past one row.
        codes, scale = self._torch_weight
        return torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16), codes, scale)

    @cached_property
    def _torch_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The row-major codes and bf16 scales torch's kernel takes."""
        return self.row_codes().contiguous(), self.scale[: self.out_features].to(torch.bfloat16)

    def lookup(self, ids: torch.Tensor | slice) -> torch.Tensor:
        scale = self.scale[: self.out_features][ids]
        return self.row_codes(ids).float() * scale.unsqueeze(1)


def quantize_weight(w: torch.Tensor, mode: QuantMode) -> QuantizedWeight:
    """Round-to-nearest quantization of a dense [out, in] weight."""
    if mode == "int4":
        return Int4Weight.quantize(w)
    return Int8Weight.quantize(w)
