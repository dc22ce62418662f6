# int4 GEMM at R rows on 1.7B shapes: weight buffers as session 24 (separate, advised if >= 4 MiB) vs in a HugePageArena; interleaved.
import ctypes
import mmap
import statistics
import sys
import time

import torch

from minisgl.heap import HugePageArena
from minisgl.kernels.native import resolve_kernels
from minisgl.layers.quant import Int4Weight

libc = ctypes.CDLL("libc.so.6")
def advise(t):
    n = t.nbytes
    if n >= 4 << 20:
        s = t.data_ptr() // 4096 * 4096; libc.madvise(ctypes.c_void_p(s), ctypes.c_size_t(t.data_ptr() + n - s), mmap.MADV_HUGEPAGE)
    return t
def sep(like):
    t = advise(torch.empty(like.shape, dtype=like.dtype)); t.copy_(like); return t
k = resolve_kernels("auto"); torch.manual_seed(0)
rows = int(sys.argv[1])
shapes = [(6144, 2048), (2048, 2048), (16384, 2048), (2048, 8192)]
arena = HugePageArena()
sets = {"per buffer": [], "arena": []}
for n, kk in shapes:
    for copy in range(3):
        base = Int4Weight.quantize(torch.randn(n, kk) * 0.02)
        a = Int4Weight(sep(base.codes), sep(base.scale), sep(base.minimum), n)
        b = Int4Weight(base.codes.clone(), base.scale.clone(), base.minimum.clone(), n); b.move_into(arena)
        sets["per buffer"].append(a.bind(k, 1)); sets["arena"].append(b.bind(k, 1))
x = {kk: torch.randn(rows, kk) for _, kk in shapes}
ins = [x[kk] for n, kk in shapes for _ in range(3)]
res = {m: [] for m in sets}
for rep in range(12):
    for m in (list(sets) if rep % 2 == 0 else list(sets)[::-1]):
        t = time.perf_counter()
        for f, xi in zip(sets[m], ins): f(xi)
        res[m].append(time.perf_counter() - t)
print(f"rows {rows}: " + ", ".join(f"{m} best {min(v)*1e3:.1f} ms median {statistics.median(v)*1e3:.1f} ms" for m, v in res.items()),
      "ratio of medians per-buffer/arena", round(statistics.median(res['per buffer']) / statistics.median(res['arena']), 3),
      "paired", sorted(round(a / b, 3) for a, b in zip(res["per buffer"], res["arena"])))
