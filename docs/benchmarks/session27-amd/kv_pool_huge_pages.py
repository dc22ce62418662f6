"""Decode attention over KV pools on 4 KiB pages (np.zeros, as kvcache/pool.py allocates them) against pools on
MADV_HUGEPAGE pages (heap.huge_page_buffer), alternating (9 rounds, median): ms per step over all layers, the
slots shuffled over a pool 1x or 4x the slots used.

Run from the repository root: python docs/benchmarks/session27-amd/kv_pool_huge_pages.py"""

import statistics
import time

import numpy as np
import torch

from minisgl.heap import huge_page_buffer
from minisgl.kernels import native

k = native.load_variant("avx512")


def zeros_small(shape):
    return torch.from_numpy(np.zeros(shape, dtype=np.uint16)).view(torch.bfloat16)


def zeros_huge(shape):
    n = int(np.prod(shape)) * 2
    return huge_page_buffer(n).zero_().view(torch.bfloat16).view(shape)


def case(heads, kvh, d, layers, batch, prefix, own, alloc, spread):
    g = torch.Generator().manual_seed(0)
    length, distinct = prefix + own, prefix + batch * own
    slots = spread * (distinct + batch)
    pools = []
    for _ in range(layers):
        kp, vp = alloc((slots, kvh, d)), alloc((slots, kvh, d))
        kp.copy_(torch.randn(slots, kvh, d, generator=g).bfloat16())
        vp.copy_(torch.randn(slots, kvh, d, generator=g).bfloat16())
        pools.append((kp, vp))
    q = torch.randn(batch, heads, d, generator=g)
    kk, vv = torch.randn(batch, kvh, d), torch.randn(batch, kvh, d)
    perm = torch.randperm(slots, generator=g)  # slots spread over the pool, as a long-running server's are
    out_slots = perm[distinct : distinct + batch]
    shared = perm[:prefix].expand(batch, prefix)
    kv_slots = torch.cat([shared, perm[prefix:distinct].view(batch, own)], 1) if own else shared
    kv_lens = torch.full((batch,), length)

    def step():
        for kp, vp in pools:
            k.paged_decode_attention(q, kk, vv, out_slots, kp, vp, kv_slots, kv_lens)

    return step


CASES = [
    ("1.7B 16 x 545 distinct", (32, 32, 64, 24, 16, 0, 545)),
    ("1.7B 16 x (512 shared + 33)", (32, 32, 64, 24, 16, 512, 33)),
    ("135M 32 x 300 distinct", (9, 3, 64, 30, 32, 0, 300)),
    ("135M 1 x 2000", (9, 3, 64, 30, 1, 0, 2000)),
]
for name, args in CASES:
    for spread in (1, 4):
        steps = {"4k": case(*args, zeros_small, spread), "huge": case(*args, zeros_huge, spread)}
        res = {m: [] for m in steps}
        for r in range(9):
            for m in list(steps) if r % 2 == 0 else list(steps)[::-1]:
                steps[m]()
                t = time.perf_counter()
                steps[m]()
                res[m].append(time.perf_counter() - t)
        a, b = statistics.median(res["4k"]) * 1e3, statistics.median(res["huge"]) * 1e3
        print(
            f"{name} (pool {spread}x the slots used, slots shuffled): 4 KiB {a:.1f} ms, huge {b:.1f} ms, {a / b:.2f}x",
            flush=True,
        )
        del steps
