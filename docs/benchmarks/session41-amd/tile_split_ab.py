"""Session 41: the integer products of an earlier commit's build against the working tree's, one process
(``benchmarks.many_rows.builds_to_compare``), where the tiles of a weight are split into blocks that differ by
one tile at most (before: blocks of a fixed size and a short last one, so that with two threads 135M's QKV
projection, 60 tiles in 8 blocks, gave one thread 32 tiles and the other 28). Decode and prefill row counts,
the outputs checked equal bit for bit; alternating calls, 9 rounds, medians.

    PYTHONPATH=. python docs/benchmarks/session41-amd/tile_split_ab.py --base 2c6a2d0
"""

from __future__ import annotations

import torch

from benchmarks.many_rows import PRODUCTS_AB_HEADER, builds_to_compare, race_products
from minisgl.kernels.native import CpuKernels
from minisgl.layers.quant import Int4Weight

SHAPES = [  # (name, out, in, rows): 135M's QKV, whose 60 tiles the split changes, and projections it does not
    ("135M qkv", 960, 576, 1), ("135M qkv", 960, 576, 8), ("135M qkv", 960, 576, 16), ("135M qkv", 960, 576, 32),
    ("135M qkv", 960, 576, 2048), ("135M o", 576, 576, 2048), ("135M gate_up", 3072, 576, 512),
]  # fmt: skip


def compare(base: CpuKernels, new: CpuKernels, name: str, n: int, k: int, rows: int, g: torch.Generator) -> None:
    w = Int4Weight.quantize(torch.randn(n, k, generator=g))
    x = torch.randn(rows, k, generator=g)
    before, after = base.int4(w.codes, w.scale, w.minimum, n), new.int4(w.codes, w.scale, w.minimum, n)
    race_products(name, x, before, after)


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print(PRODUCTS_AB_HEADER)
    g = torch.Generator().manual_seed(0)
    for name, n, k, rows in SHAPES:
        compare(base, new, name, n, k, rows, g)


if __name__ == "__main__":
    main()
