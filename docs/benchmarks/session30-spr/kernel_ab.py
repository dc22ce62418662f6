"""Session 30: the amx build of an earlier commit's kernel sources against the working tree's, both
libraries loaded in one process and alternating (7 rounds, the median), each pair of outputs checked equal,
bit for bit:

- prefill rows' products (``int4_gemm_bf16``) on the engine's shapes at the row counts a prefill pass gives
  them (``benchmarks.many_rows.PREFILL_PRODUCTS``, as ``session29-spr/tile_ab.py``);
- decode rows' products (``int4_gemm``, one int8 digit of x as every layer's products take it) at 1-32 rows.

    PYTHONPATH=. python docs/benchmarks/session30-spr/kernel_ab.py --base 5fbc270
"""

from __future__ import annotations

from functools import partial

import torch

from benchmarks.many_rows import PREFILL_PRODUCTS, builds_to_compare, race
from minisgl.layers.quant import Int4Weight

DECODE = [
    ("1.7B qkv", 6144, 2048),
    ("1.7B gate_up", 16384, 2048),
    ("1.7B down", 2048, 8192),
    ("135M gate_up", 3072, 576),
]
DECODE_ROWS = (1, 8, 16, 32)


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print("| prefill rows' product | rows | base ms | new ms | speed-up | new GFLOP/s | same bits |")
    print("|---|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for name, n, k, rows in PREFILL_PRODUCTS:
        w = Int4Weight.quantize(torch.randn(n, k, generator=g))
        x = torch.randn(rows, k, generator=g)
        before = base.int4(w.codes, w.scale, w.minimum, n)
        after = new.int4(w.codes, w.scale, w.minimum, n)
        same = torch.equal(before(x, rows), after(x, rows))
        calls = {"base": partial(before, x, rows), "new": partial(after, x, rows)}
        t = race(calls, max(2, int(1e10 / (2 * rows * n * k))), rounds=7)
        print(f"| {name} | {rows} | {t['base'] * 1e3:.2f} | {t['new'] * 1e3:.2f} | {t['base'] / t['new']:.2f}x | "
              f"{2 * rows * n * k / t['new'] / 1e9:.0f} | {same} |", flush=True)  # fmt: skip
    print("\n| decode rows' product | rows | base ms | new ms | speed-up | same bits |")
    print("|---|---|---|---|---|---|")
    for name, n, k in DECODE:
        w = Int4Weight.quantize(torch.randn(n, k, generator=g))
        before = base.int4(w.codes, w.scale, w.minimum, n)
        after = new.int4(w.codes, w.scale, w.minimum, n)
        for rows in DECODE_ROWS:
            x = torch.randn(rows, k, generator=g)
            same = torch.equal(before(x), after(x))
            calls = {"base": partial(before, x), "new": partial(after, x)}
            t = race(calls, max(5, int(3e9 / (2 * max(rows, 8) * n * k))), rounds=7)
            print(f"| {name} | {rows} | {t['base'] * 1e3:.3f} | {t['new'] * 1e3:.3f} | {t['base'] / t['new']:.2f}x | "
                  f"{same} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
