"""Session 39: the prefill rows' bf16 products (``int4_gemm_bf16``, the default model's int4 weights) of an
earlier commit's amx build against the working tree's, both libraries loaded in one process and alternating
(9 rounds of 3 calls, the median), each pair of outputs checked equal, bit for bit, on the engine's shapes at
the row counts a prefill pass gives them (``benchmarks.many_rows.PREFILL_PRODUCTS``).

    PYTHONPATH=. python docs/benchmarks/session39-spr/prefill_products_ab.py --base 1e6be05
"""

from __future__ import annotations

import torch

from benchmarks.many_rows import PREFILL_PRODUCTS, builds_to_compare, race
from minisgl.kernels.native import CpuKernels
from minisgl.layers.quant import Int4Weight


def compare(base: CpuKernels, new: CpuKernels, name: str, n: int, k: int, rows: int, g: torch.Generator) -> None:
    w = Int4Weight.quantize(torch.randn(n, k, generator=g))
    x = torch.randn(rows, k, generator=g)
    before = base.int4(w.codes, w.scale, w.minimum, n)
    after = new.int4(w.codes, w.scale, w.minimum, n)
    same = torch.equal(before(x, rows), after(x, rows))
    t = race({"base": lambda: before(x, rows), "new": lambda: after(x, rows)}, repeats=3, rounds=9)
    print(f"| {name} | {rows} | {1e3 * t['base']:.2f} | {1e3 * t['new']:.2f} | {t['base'] / t['new']:.2f}x "
          f"| {2 * rows * n * k / t['new'] / 1e9:.0f} | {same} |")  # fmt: skip


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print("| product | rows | base ms | new ms | speed-up | new GFLOP/s | same bits |")
    print("|---|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for name, n, k, rows in PREFILL_PRODUCTS:
        compare(base, new, name, n, k, rows, g)


if __name__ == "__main__":
    main()
