"""Session 33: decode rows' quantized products, the amx build of an earlier commit's kernel sources (the
vector bodies at every decode row count) against the working tree's (from 9 rows on, each group's integer
sums on AMX-INT8), both libraries loaded in one process and alternating (``benchmarks.many_rows.race``: 7
rounds, the median), each pair of outputs checked equal bit for bit. The layers' products take one int8
digit of x; the int8 LM head takes two.

    PYTHONPATH=. python docs/benchmarks/session33-spr/amx_decode_ab.py --base a11829a
"""

from __future__ import annotations

from functools import partial

import torch

from benchmarks.many_rows import builds_to_compare, race
from minisgl.layers.quant import Int4Weight, Int8Weight, QuantizedWeight

# (name, out, in, format, digits of x)
PRODUCTS = [
    ("1.7B qkv", 6144, 2048, Int4Weight, 1),
    ("1.7B gate_up", 16384, 2048, Int4Weight, 1),
    ("1.7B down", 2048, 8192, Int4Weight, 1),
    ("1.7B lm_head", 49152, 2048, Int8Weight, 2),
    ("135M gate_up", 3072, 576, Int4Weight, 1),
    ("135M lm_head", 49152, 576, Int8Weight, 2),
]
ROWS = (1, 8, 9, 16, 17, 32, 64)


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print("| product | rows | base ms | new ms | speed-up | same bits |")
    print("|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for name, n, k, kind, digits in PRODUCTS:
        weight: QuantizedWeight = kind.quantize(torch.randn(n, k, generator=g) * 0.02)
        before, after = weight.bind(base, digits), weight.bind(new, digits)
        for rows in ROWS:
            x = torch.randn(rows, k, generator=g)
            same = torch.equal(before(x), after(x))
            calls = {"base": partial(before, x), "new": partial(after, x)}
            t = race(calls, max(3, int(3e9 / (2 * max(rows, 8) * n * k))), rounds=7)
            print(f"| {name} | {rows} | {t['base'] * 1e3:.3f} | {t['new'] * 1e3:.3f} | {t['base'] / t['new']:.2f}x | "
                  f"{same} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
