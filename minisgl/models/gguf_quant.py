"""Read a GGUF file's quantization grids, to run its weights in their own precision.

The converted HF folder (``gguf.py``) holds the dequantized values; for the 4-bit formats this module
reads the per-group scale and minimum from the file's blocks, so that ``Int4Weight.from_groups``
recovers the file's exact 4-bit codes from those values. Each grid is keyed by the Hugging Face
tensor name and its rows are in HF order (llama.cpp's q/k row permutation undone), like the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from minisgl.layers.quant import INT4_GROUP
from minisgl.models.gguf import _field
from minisgl.models.gguf_arch import gguf_arch, hf_tensors

# Formats whose values are exactly (q - 8) * scale + zero on groups of 32 with q in 0..15.
INT4_EXACT = ("Q4_0", "Q4_1", "Q4_K")
# 5 to 8 bits per weight: requantized to int8 with one scale per row (the int8 kernel's layout).
INT8_NEAREST = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")


@dataclass(frozen=True)
class Grid:
    """w = scale * q + minimum for q in 0..15, per group of 32 input columns: [rows, in / 32] each."""

    scale: torch.Tensor
    minimum: torch.Tensor

    def rows(self, start: int, end: int) -> Grid:
        return Grid(self.scale[start:end], self.minimum[start:end])

    def columns(self, start: int, end: int) -> Grid:
        if start % INT4_GROUP or end % INT4_GROUP:
            raise ValueError(f"columns {start}:{end} split a group of {INT4_GROUP} quantized weights")
        g0, g1 = start // INT4_GROUP, end // INT4_GROUP
        return Grid(self.scale[:, g0:g1], self.minimum[:, g0:g1])

    @staticmethod
    def cat(grids: list[Grid]) -> Grid:
        return Grid(torch.cat([g.scale for g in grids]), torch.cat([g.minimum for g in grids]))


class GGUFWeights:
    """The quantization type and, for 4-bit formats, the grid of each weight in a GGUF file."""

    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader

        reader = GGUFReader(path)
        arch_name = _field(reader, "general.architecture")
        arch = gguf_arch(arch_name, path.name)
        heads = _field(reader, f"{arch_name}.attention.head_count")
        # What hf_tensors needs to undo llama.cpp's q/k row permutation.
        config = {
            "num_attention_heads": heads,
            "num_key_value_heads": _field(reader, f"{arch_name}.attention.head_count_kv") or heads,
        }
        self.name = path.name
        self._types: dict[str, str] = {}
        self._grids: dict[str, Grid] = {}
        for tensor in reader.tensors:
            kind = tensor.tensor_type.name
            data = np.asarray(tensor.data)
            if kind not in INT4_EXACT:
                self._types.update((name, kind) for name, _ in hf_tensors(arch, config, tensor.name, data))
                continue
            grid = grid_from_blocks(kind, data, int(np.prod(data.shape[:-1])))
            # Grids have the weights' row structure (experts, rows), so they split and un-permute alike.
            lead = data.shape[:-1]
            scales = hf_tensors(arch, config, tensor.name, grid.scale.numpy().reshape(*lead, -1))
            minima = hf_tensors(arch, config, tensor.name, grid.minimum.numpy().reshape(*lead, -1))
            for (name, scale), (_, minimum) in zip(scales, minima):
                self._types[name] = kind
                self._grids[name] = Grid(torch.from_numpy(scale.copy()), torch.from_numpy(minimum.copy()))

    def type_name(self, hf_name: str) -> str:
        return self._types[hf_name]

    def __contains__(self, hf_name: str) -> bool:
        return hf_name in self._types

    def grid(self, hf_name: str) -> Grid:
        if hf_name not in self._grids:
            raise ValueError(f"{self.name}: {hf_name} is {self._types.get(hf_name)}, not a 4-bit format ({', '.join(INT4_EXACT)})")
        return self._grids[hf_name]


def grid_from_blocks(kind: str, data: np.ndarray, rows: int) -> Grid:
    """The grid of a ``rows``-row tensor stored as ``kind`` blocks (``data``: its raw bytes, row-major)."""
    scale, minimum = _GRID_READERS[kind](data.reshape(-1).view(np.uint8))
    return Grid(torch.from_numpy(scale.reshape(rows, -1).copy()), torch.from_numpy(minimum.reshape(rows, -1).copy()))


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    return blocks[:, offset : offset + 2].copy().view(np.float16).astype(np.float32).reshape(-1)


def _q4_0(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = _f16(data.reshape(-1, 18), 0)  # fp16 d, 16 bytes of codes: w = d * (q - 8)
    return d, -8 * d


def _q4_1(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blocks = data.reshape(-1, 20)  # fp16 d, fp16 m, 16 bytes of codes: w = d * q + m
    return _f16(blocks, 0), _f16(blocks, 2)


def _q4_k(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from gguf.quants import Q4_K

    # 256 weights: fp16 d and dmin, 12 bytes of 6-bit scales and mins for 8 groups of 32, 128 bytes
    # of codes: w = d * sc * q - dmin * m.
    blocks = data.reshape(-1, 144)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    d, dmin = _f16(blocks, 0)[:, None], _f16(blocks, 2)[:, None]
    return (d * sc.astype(np.float32)).reshape(-1), (-dmin * m.astype(np.float32)).reshape(-1)


_GRID_READERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k}
