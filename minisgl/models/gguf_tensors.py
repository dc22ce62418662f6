"""A GGUF file's tensors under their Hugging Face names, read in place.

The file is memory-mapped and its header parsed here (``gguf.GGUFReader`` parses every token of the
vocabulary into arrays, seconds for each read): a tensor's bytes are read when a weight is built
from them, and nothing is written anywhere. Each tensor keeps the file's blocks, split and reordered
like the Hugging Face weights (stacked experts split, llama.cpp's q/k row permutation undone: both
act on whole rows, so they apply to the rows of blocks as they do to the dequantized rows).

Two ways to read one:
- ``dense``: dequantized to fp32 with the ``gguf`` package's reference code.
- ``int4``: for Q4_0 / Q4_1 / Q4_K, the file's own 4-bit codes, scale and minimum per group of 32 in
  ``Int4Weight``'s layout, taken from the blocks without going through fp32 (exact; Q4_K's products
  of two scales rounded to fp16).
- ``int8``: rounded to int8 with one scale per row (``Int8Weight.quantize`` of the dense values).

With the C kernels, Q4_0 / Q4_1 and Q8_0 blocks go into the tiles in one pass over the map
(``kernels/cpu/gguf_tiles.c``): the same bytes as the numpy and torch path here, which runs without
them, without its copies and fp32 temporaries (a start-up cost: ``benchmarks.cold_start``).
"""

from __future__ import annotations

import mmap
import struct
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from minisgl.heap import HugePageArena
from minisgl.kernels.native import CpuKernels
from minisgl.layers.quant import INT4_GROUP, Int4Weight, Int8Weight
from minisgl.models.gguf_arch import GGUFArch, gguf_arch, hf_tensors, unpermute_qk

# Formats whose values are exactly q * scale + minimum on groups of 32 with q in 0..15.
INT4_EXACT = ("Q4_0", "Q4_1", "Q4_K")
# 5 to 8 bits per weight: requantized to int8 with one scale per row (the int8 kernel's layout).
INT8_NEAREST = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")


def read_metadata(path: Path) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """Every metadata field of a GGUF file (the tokenizer's arrays of strings too) and each tensor's
    GGUF dims (innermost first) by GGUF name: what the config-and-tokenizer folder is written from."""
    with path.open("rb") as f:
        try:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError) as e:  # an empty file cannot be mapped
            raise ValueError(f"cannot read GGUF file {path}: {e}") from e
    fields, tensors = _read_gguf(path, mapped, strings=True)
    return fields, {name: dims for name, dims, _, _ in tensors}  # the map closes with its last view


# Value types of GGUF metadata (the spec's numbering): fixed-size scalars by struct format, then
# 8 string (uint64 length, bytes) and 9 array (uint32 item type, uint64 count, items).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_NUMPY = {
    "F32": np.float32,
    "F16": np.float16,
    "F64": np.float64,
    "I8": np.int8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
}


class _Cursor:
    """Little-endian reads from a byte buffer."""

    def __init__(self, data: memoryview) -> None:
        self.data, self.at = data, 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        self.at += n
        return bytes(self.data[self.at - n : self.at]).decode("utf-8")

    def value(self, kind: int, strings: bool) -> Any:
        """A metadata value; an array of strings (the tokenizer's) is skipped (None) unless ``strings``."""
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        item, count = self.scalar("I"), self.scalar("Q")
        if item in _SCALARS:
            fmt = _SCALARS[item]
            size = struct.calcsize(fmt)
            values = list(struct.unpack_from(f"<{count}{fmt}", self.data, self.at))
            self.at += count * size
            return values
        if item == _STRING:
            if strings:
                return [self.string() for _ in range(count)]
            for _ in range(count):  # stepped over undecoded: a uint64 length, then the bytes
                self.at += 8 + struct.unpack_from("<Q", self.data, self.at)[0]
            return None
        for _ in range(count):
            self.value(item, strings)
        return None


def _read_gguf(
    path: Path, mapped: mmap.mmap, strings: bool = False
) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], Any, np.ndarray]]]:
    """A GGUF file's metadata (arrays of strings only if ``strings``) and tensors (name, GGUF dims
    innermost first, type, data in ``mapped``, the file's map, with the ``gguf`` package's array
    shapes: blocks as [..., rows, bytes]), parsed directly: the ``gguf`` reader builds an array for
    every token of the vocabulary, seconds at start-up."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        data = np.frombuffer(mapped, dtype=np.uint8)
        cursor = _Cursor(memoryview(data))
        if bytes(data[:4]) != b"GGUF":
            raise ValueError(f"magic {bytes(data[:4])!r}, expected b'GGUF'")
        cursor.at = 4
        version, n_tensors, n_fields = cursor.scalar("I"), cursor.scalar("Q"), cursor.scalar("Q")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported (2 or later)")
        fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = cursor.string()
            fields[key] = cursor.value(cursor.scalar("I"), strings)
        infos = []
        for _ in range(n_tensors):
            name = cursor.string()
            dims = tuple(cursor.scalar("Q") for _ in range(cursor.scalar("I")))
            infos.append((name, dims, GGMLQuantizationType(cursor.scalar("I")), cursor.scalar("Q")))
        alignment = fields.get("general.alignment", 32)
        start = (cursor.at + alignment - 1) // alignment * alignment
        tensors = []
        for name, dims, kind, offset in infos:
            block, size = GGML_QUANT_SIZES[kind]
            shape = tuple(reversed(dims))
            count = int(np.prod(dims))
            if kind.name in _NUMPY:
                dtype = np.dtype(_NUMPY[kind.name])
                array = data[start + offset : start + offset + count * dtype.itemsize].view(dtype).reshape(shape)
            else:
                row = dims[0] // block * size
                array = data[start + offset : start + offset + count // block * size].reshape(*shape[:-1], row)
            tensors.append((name, dims, kind, array))
    except (ValueError, struct.error, KeyError) as e:
        raise ValueError(f"cannot read GGUF file {path}: {e}") from e
    return fields, tensors


class GGUFTensors:
    """Every tensor of a GGUF file by Hugging Face name: its format, shape and blocks.

    Reading a tensor hands its pages of the map back to the kernel (``MADV_DONTNEED``): every weight
    is copied into its own layout, so without that a load would hold the file's pages and the
    weights built from them at once, twice the model at its peak. The pages stay in the page cache,
    so a tensor read again (a tensor-parallel rank's second slice) is only faulted back in."""

    def __init__(self, path: Path, kernels: CpuKernels | None = None) -> None:
        """``kernels``: the C kernels that build the quantized weights they can (None: numpy and torch)."""
        self._kernels = kernels
        with path.open("rb") as f:
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (ValueError, OSError) as e:  # an empty file cannot be mapped
                raise ValueError(f"cannot read GGUF file {path}: {e}") from e
        self._base = np.frombuffer(self._map, dtype=np.uint8).ctypes.data
        fields, tensors = _read_gguf(path, self._map)
        header = min((np.lib.array_utils.byte_bounds(t[3])[0] - self._base for t in tensors), default=0)
        self._release(np.frombuffer(self._map, dtype=np.uint8, count=header))  # parsed: its pages are done
        arch_name = fields.get("general.architecture")
        self.arch: GGUFArch = gguf_arch(arch_name, path.name)
        heads = fields.get(f"{arch_name}.attention.head_count")
        # What hf_tensors needs to undo llama.cpp's q/k row permutation.
        config = {
            "num_attention_heads": heads,
            "num_key_value_heads": fields.get(f"{arch_name}.attention.head_count_kv") or heads,
        }
        self.name = path.name
        self._tensors: dict[str, _Tensor] = {}
        for gguf_name, dims, kind, data in tensors:
            for name, blocks, heads in hf_tensors(self.arch, config, gguf_name, data):
                self._tensors[name] = _Tensor(blocks, kind, int(dims[0]), heads)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def names(self) -> list[str]:
        return list(self._tensors)

    def type_name(self, name: str) -> str:
        return self._tensors[name].kind.name

    def shape(self, name: str) -> tuple[int, ...]:
        tensor = self._tensors[name]
        return (*tensor.blocks.shape[:-1], tensor.columns)

    def dense(self, name: str) -> torch.Tensor:
        """The tensor dequantized, fp32 (a copy: the file is never written through); a norm's
        weight as Hugging Face has it (gemma3 files store 1 + weight)."""
        from gguf.quants import dequantize

        tensor = self._tensors[name]
        blocks, kind = tensor.rows(), tensor.kind
        if kind.name == "Q8_0":  # the reference's arithmetic (code * fp32(d)) on torch's threads
            b = _read_only_tensor(blocks).view(-1, 34)  # fp16 d, 32 int8 codes
            d = b[:, :2].contiguous().view(torch.float16).float()
            dense = b[:, 2:].view(torch.int8).float().mul_(d).view(self.shape(name))
        else:
            values = dequantize(blocks, kind)
            if not values.flags.writeable:  # a view of the read-only map (F32 tensors): copied
                values = values.copy()
            dense = torch.from_numpy(values.astype(np.float32, copy=False).reshape(self.shape(name)))
        self._release(tensor.blocks)
        if self.arch.norm_shift and name.endswith("norm.weight"):
            dense -= self.arch.norm_shift
        return dense

    def int4(self, *names: str, arena: HugePageArena | None = None) -> Int4Weight:
        """The file's 4-bit codes and grid as an ``Int4Weight`` (Q4_0 / Q4_1 / Q4_K, a multiple of
        32 columns), built in ``arena`` where given; several tensors' rows one after another (a fused
        projection), each written in place: no concatenated copy."""
        parts, k = self._parts(names)
        weight = Int4Weight.empty(sum(len(part.blocks) for part in parts), k, arena)
        row = 0
        for name, part in zip(names, parts):
            blocks, kind = part.rows(), part.kind.name
            if self._kernels is not None and kind in ("Q4_0", "Q4_1"):
                buffers = (weight.codes, weight.scale, weight.minimum)
                tensor = _read_only_tensor(np.ascontiguousarray(blocks))
                self._kernels.int4_from_gguf(tensor, kind == "Q4_1", row, buffers, weight.out_features)
            else:
                int4_into(weight, row, kind, blocks, k, f"{self.name}: {name}")
            self._release(part.blocks)
            row += len(blocks)
        return weight

    def int8(self, *names: str, arena: HugePageArena | None = None) -> Int8Weight:
        """The tensors' rows one after another rounded to int8 with one scale per row, as
        ``Int8Weight.quantize`` rounds their dense values; Q8_0 ones through the C kernels built in
        ``arena`` where given."""
        parts, k = self._parts(names)
        if self._kernels is None or any(part.kind.name != "Q8_0" for part in parts):
            dense = [self.dense(name) for name in names]
            return Int8Weight.quantize(torch.cat(dense) if len(dense) > 1 else dense[0])
        weight = Int8Weight.empty(sum(len(part.blocks) for part in parts), k, arena)
        row = 0
        for part in parts:
            tensor = _read_only_tensor(np.ascontiguousarray(part.rows()))
            self._kernels.int8_from_q8_0(tensor, row, (weight.codes, weight.scale), weight.out_features)
            self._release(part.blocks)
            row += len(part.blocks)
        return weight

    def _parts(self, names: tuple[str, ...]) -> tuple[list[_Tensor], int]:
        """The named tensors, which make one weight, and their common columns."""
        parts = [self._tensors[name] for name in names]
        columns = {part.columns for part in parts}
        if len(columns) != 1:
            raise ValueError(f"{self.name}: {', '.join(names)} differ in columns ({sorted(columns)}): not one weight")
        return parts, columns.pop()

    def _pages(self, blocks: np.ndarray) -> tuple[int, int] | None:
        """The map's whole pages inside ``blocks`` (start, end offsets), or None: none, or blocks that
        are a copy, not a view of the map."""
        low, high = np.lib.array_utils.byte_bounds(blocks)
        start = -(-(low - self._base) // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (high - self._base) // mmap.PAGESIZE * mmap.PAGESIZE
        return (start, end) if 0 <= start < end <= len(self._map) else None

    def _release(self, blocks: np.ndarray) -> None:
        """Drop the map's pages under ``blocks`` from this process (a page shared with another tensor
        stays)."""
        pages = self._pages(blocks)
        if pages is not None:
            self._map.madvise(mmap.MADV_DONTNEED, pages[0], pages[1] - pages[0])


class _Tensor(NamedTuple):
    """A tensor of the file: its blocks (a view of the map), quantization type, columns, and the heads
    whose rows llama.cpp interleaved (0: none)."""

    blocks: np.ndarray
    kind: Any
    columns: int
    heads: int

    def rows(self) -> np.ndarray:
        """The blocks in Hugging Face's row order: the map's view, or for interleaved q/k rows a copy."""
        return unpermute_qk(self.blocks, self.heads) if self.heads else self.blocks


def _read_only_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over a read-only array of the map, only ever read (torch warns that it could be written)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def int4_from_blocks(kind: str, blocks: np.ndarray, columns: int, what: str = "a tensor") -> Int4Weight:
    """A [rows, columns] tensor stored as ``kind`` blocks (``blocks``: [rows, bytes]) as an ``Int4Weight``."""
    weight = Int4Weight.empty(len(blocks), columns)
    int4_into(weight, 0, kind, blocks, columns, what)
    return weight


def int4_into(out: Int4Weight, row: int, kind: str, blocks: np.ndarray, columns: int, what: str = "a tensor") -> None:
    """Write ``kind`` blocks ([rows, bytes]) into ``out``'s rows from ``row`` on."""
    if kind not in INT4_EXACT or columns % INT4_GROUP or blocks.ndim != 2:
        raise ValueError(f"{what} is {kind} with {columns} columns, not int4-exact ({', '.join(INT4_EXACT)})")
    words, scale, minimum = _INT4_READERS[kind](blocks, columns)
    out.write_rows(row, _read_only_tensor(words.view(np.int32)), torch.from_numpy(scale), torch.from_numpy(minimum))


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 at byte ``offset`` (even) of every block (the last axis: a block's bytes, an even
    number), read as 2-byte words: a strided copy of whole elements, not of byte pairs."""
    return np.ascontiguousarray(blocks.view(np.uint16)[..., offset // 2]).view(np.float16)


# Each reader gives a tensor's code words [rows, groups, 4] (each group's 16 code bytes: column j in
# the low nibble of byte j, j + 16 in its high one) and its fp16 scales and minimums [rows, groups].
Int4Parts = tuple[np.ndarray, np.ndarray, np.ndarray]


def _q4_0(blocks: np.ndarray, columns: int) -> Int4Parts:
    b = blocks.reshape(blocks.shape[0], columns // INT4_GROUP, 18)  # fp16 d, 16 bytes: w = d * (q - 8)
    d = _f16(b, 0)
    words = np.ascontiguousarray(b[..., 2:]).view(np.uint32)
    return words, d, (-8 * d.astype(np.float32)).astype(np.float16)  # exact: a power of two times an fp16


def _q4_1(blocks: np.ndarray, columns: int) -> Int4Parts:
    b = blocks.reshape(blocks.shape[0], columns // INT4_GROUP, 20)  # fp16 d, fp16 m, 16 bytes: w = d * q + m
    # 20-byte blocks: 5 words each, the codes words 1-4, read in place (no copy before the tiling).
    words = np.ascontiguousarray(blocks).view(np.uint32).reshape(blocks.shape[0], -1, 5)[..., 1:]
    return words, _f16(b, 0), _f16(b, 2)


def _q4_k(blocks: np.ndarray, columns: int) -> Int4Parts:
    from gguf.quants import Q4_K

    # 256 weights: fp16 d and dmin, 12 bytes of 6-bit scales and mins for 8 groups of 32, 128 bytes
    # of codes, 32 bytes per 64 weights (element l low, l + 32 high): w = d * sc * q - dmin * m.
    rows = blocks.shape[0]
    b = blocks.reshape(-1, 144)
    sc, m = Q4_K.get_scale_min(b[:, 4:16])
    d, dmin = _f16(b, 0).astype(np.float32)[:, None], _f16(b, 2).astype(np.float32)[:, None]
    qs = b[:, 16:].reshape(-1, 4, 1, 32)
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(rows, columns // INT4_GROUP, 2, 16)
    words = np.ascontiguousarray(codes[:, :, 0] | (codes[:, :, 1] << 4)).view(np.uint32)
    scale = (d * sc.astype(np.float32)).reshape(rows, -1).astype(np.float16)
    minimum = (-dmin * m.astype(np.float32)).reshape(rows, -1).astype(np.float16)
    return words, scale, minimum


_INT4_READERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k}
