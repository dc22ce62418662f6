"""Session 56: the vpdpbusd builds' many-row products at 1.7B and 135M shapes, an earlier commit's build against
the working tree's (VNNI_SPAN: 64 groups a pass over the rows of x, where 32 were), one process
(``benchmarks.many_rows.builds_to_compare``): int4 with one digit of x as the layers take it, the LM head's int8
with two; the outputs checked equal bit for bit; alternating calls, 9 rounds, medians.

    PYTHONPATH=. python docs/benchmarks/session56-amd/span_ab.py --base ab592a9 [--variant avxvnni]
"""

from __future__ import annotations

import torch

from benchmarks.many_rows import PRODUCTS_AB_HEADER, builds_to_compare, race_products
from minisgl.layers.quant import Int4Weight, Int8Weight

SHAPES = [  # (name, out, in, rows): prefill passes' products (the MLP's in its bands) and 16-row decode steps
    ("1.7B qkv", 6144, 2048, 2048), ("1.7B o", 2048, 2048, 2048), ("1.7B gate_up", 16384, 2048, 256),
    ("1.7B down", 2048, 8192, 256), ("1.7B gate_up", 16384, 2048, 16), ("1.7B down", 2048, 8192, 16),
    ("135M qkv", 960, 576, 2048), ("135M gate_up", 3072, 576, 512), ("135M down", 576, 1536, 512),
]  # fmt: skip
LM_HEADS = [("1.7B lm_head", 49152, 2048, 16), ("135M lm_head", 49152, 576, 16)]


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print(PRODUCTS_AB_HEADER)
    g = torch.Generator().manual_seed(0)
    for name, n, k, rows in SHAPES:
        w, x = Int4Weight.quantize(torch.randn(n, k, generator=g)), torch.randn(rows, k, generator=g)
        before, after = (kernels.int4(w.codes, w.scale, w.minimum, n) for kernels in (base, new))
        race_products(f"{name}, int4", x, before, after)
    for name, n, k, rows in LM_HEADS:
        w, x = Int8Weight.quantize(torch.randn(n, k, generator=g)), torch.randn(rows, k, generator=g)
        before, after = (kernels.int8(w.codes, w.scale, n, digits=2) for kernels in (base, new))
        race_products(f"{name}, int8, two digits", x, before, after)


if __name__ == "__main__":
    main()
