"""Session 51: the int4 products of an earlier commit's build against the working tree's, one process
(``benchmarks.many_rows.builds_to_compare``), where the avx2 build runs more than 8 rows of x with one digit through
``whole_tile``: a block's codes unpacked once per span, and each broadcast of x serving both vectors of a tile. The
default model's projections and the 1.7B scale model's MLP at decode and prefill row counts, each shape's weights
rotating through copies that fill 64 MiB, so that they come from memory as in a model's pass; the outputs checked
equal bit for bit; alternating calls, 9 rounds, medians.

    PYTHONPATH=. python docs/benchmarks/session51-amd/products_ab.py --base f62b035
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from benchmarks.many_rows import PRODUCTS_AB_HEADER, builds_to_compare, race_products
from minisgl.kernels.native import CpuKernels
from minisgl.layers.quant import Int4Weight

SHAPES = [  # (name, out, in, rows): decode steps' rows (past 8: the new path), and prefill passes'
    ("135M qkv", 960, 576, 8), ("135M qkv", 960, 576, 16), ("135M gate_up", 3072, 576, 16),
    ("135M down", 576, 1536, 32), ("135M gate_up", 3072, 576, 64), ("135M qkv", 960, 576, 2048),
    ("135M o", 576, 576, 2048), ("135M gate_up", 3072, 576, 512), ("135M down", 576, 1536, 512),
    ("1.7B gate_up", 16384, 2048, 16), ("1.7B gate_up", 16384, 2048, 512), ("1.7B down", 2048, 8192, 512),
]  # fmt: skip
ROTATION_BYTES = 64 << 20


def products(kernels: CpuKernels, weights: list[Int4Weight]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The product by each of ``weights`` in turn, call by call."""
    calls = itertools.cycle([kernels.int4(w.codes, w.scale, w.minimum, w.out_features) for w in weights])
    return lambda x: next(calls)(x)


def compare(
    name: str, rows: int, base: CpuKernels, new: CpuKernels, weights: list[Int4Weight], x: torch.Tensor
) -> None:
    before, after = products(base, weights), products(new, weights)
    repeats = max(len(weights), 20 if rows <= 64 else 3)
    race_products(f"{name}, int4", x, before, after, repeats, checks=len(weights))


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print(PRODUCTS_AB_HEADER)
    g = torch.Generator().manual_seed(0)
    for name, n, k, rows in SHAPES:
        copies = max(1, ROTATION_BYTES // (n * k // 2))
        weights = [Int4Weight.quantize(torch.randn(n, k, generator=g)) for _ in range(copies)]
        compare(name, rows, base, new, weights, torch.randn(rows, k, generator=g))


if __name__ == "__main__":
    main()
