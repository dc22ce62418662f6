"""The int4 many-row products (one digit) on the 135M and 1.7B projections: this tree's avx512 build against
a build of the C sources in another folder, in one process, alternating (10 rounds, median), and whether the
two give the same bits.

Run from the repository root: python docs/benchmarks/session27-amd/products_ab.py FOLDER 256,512"""

import statistics
import sys
import time
from pathlib import Path

import torch

from minisgl.kernels import native
from minisgl.layers.quant import Int4Weight

other = Path(sys.argv[1])
rows_list = [int(r) for r in sys.argv[2].split(",")]
base = native.load_variant("avx512")
native.SOURCE_DIR = other
native.load_variant.cache_clear()
mod = native.load_variant("avx512")
torch.manual_seed(0)
shapes = {
    "135M": [(960, 576), (3072, 576), (576, 1536), (576, 576)],
    "1.7B": [(6144, 2048), (16384, 2048), (2048, 8192), (2048, 2048)],
}
for size, sh in shapes.items():
    ws = [Int4Weight.quantize(torch.randn(n, k) * 0.02) for n, k in sh]
    for rows in rows_list:
        xs = [torch.randn(rows, k) for n, k in sh]
        fa = [w.bind(base, 1) for w in ws]
        fb = [w.bind(mod, 1) for w in ws]
        ya = [f(x) for f, x in zip(fa, xs)]
        yb = [f(x) for f, x in zip(fb, xs)]
        same = all(torch.equal(a, b) for a, b in zip(ya, yb))
        res = {"base": [], "mod": []}
        for rep in range(10):
            for m, fs in (("base", fa), ("mod", fb)) if rep % 2 == 0 else (("mod", fb), ("base", fa)):
                t = time.perf_counter()
                for f, x in zip(fs, xs):
                    f(x)
                res[m].append(time.perf_counter() - t)
        flops = sum(2 * rows * n * k for n, k in sh)
        a, b = statistics.median(res["base"]), statistics.median(res["mod"])
        print(
            f"{size} rows {rows}: base {a * 1e3:.2f} ms ({flops / a / 1e9:.0f} GFLOP/s) mod {b * 1e3:.2f} ms ({flops / b / 1e9:.0f}) speed-up {a / b:.3f} same bits {same}",
            flush=True,
        )
