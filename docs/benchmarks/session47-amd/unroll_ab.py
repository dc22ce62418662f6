"""Session 47: the integer products of an earlier commit's build against the working tree's, one process
(``benchmarks.many_rows.builds_to_compare``), where ``gemm_tile``'s loops over the rows are unrolled
(``#pragma GCC unroll``) so that the accumulators stay in registers. Decode and prefill row counts of the default
model's projections, int4 with one digit of x as the layers take it and the LM head's int8 with two; the outputs
checked equal bit for bit; alternating calls, 9 rounds, medians.

    PYTHONPATH=. python docs/benchmarks/session47-amd/unroll_ab.py --base 9bd22e3
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks.many_rows import PRODUCTS_AB_HEADER, builds_to_compare, race_products
from minisgl.kernels.native import CpuKernels
from minisgl.layers.quant import Int4Weight, Int8Weight

SHAPES = [  # (name, out, in, rows): a decode step's rows, and a prefill pass's (the MLP's in its bands)
    ("qkv", 960, 576, 1), ("qkv", 960, 576, 8), ("qkv", 960, 576, 16), ("qkv", 960, 576, 32),
    ("qkv", 960, 576, 2048), ("o", 576, 576, 2048), ("gate_up", 3072, 576, 512), ("down", 576, 1536, 512),
]  # fmt: skip
LM_HEAD_ROWS = (1, 16, 32)


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print(PRODUCTS_AB_HEADER)
    g = torch.Generator().manual_seed(0)
    for name, n, k, rows in SHAPES:
        w = Int4Weight.quantize(torch.randn(n, k, generator=g))
        x = torch.randn(rows, k, generator=g)
        products = [kernels.int4(w.codes, w.scale, w.minimum, n) for kernels in (base, new)]
        race_products(f"{name}, int4", x, *products)
    head = Int8Weight.quantize(torch.randn(49152, 576, generator=g))
    for rows in LM_HEAD_ROWS:
        x = torch.randn(rows, 576, generator=g)
        products = [_int8(kernels, head) for kernels in (base, new)]
        race_products("lm_head, int8, two digits", x, *products)


def _int8(kernels: CpuKernels, w: Int8Weight) -> Callable[[torch.Tensor], torch.Tensor]:
    return kernels.int8(w.codes, w.scale, w.out_features, digits=2)


if __name__ == "__main__":
    main()
