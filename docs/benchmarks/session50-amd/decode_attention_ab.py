"""Session 50: decode attention over a bf16 pool, an earlier commit's build against the working tree's, one
process (``benchmarks.many_rows.builds_to_compare``): the decode steps of the harness's bursts at 135M and 1.7B,
every layer's pool read in turn (as a step reads them), the outputs checked equal bit for bit; alternating
calls, 9 rounds, medians.

    PYTHONPATH=. python docs/benchmarks/session50-amd/decode_attention_ab.py --base 70759ff
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks.decode_attention import case_slots, distinct_rows
from benchmarks.many_rows import builds_to_compare, race
from minisgl.kernels.native import CpuKernels

CASES = [  # (name, query heads, KV heads, head dim, layers, requests, keys each, of them shared by all)
    ("135M shared-prefix burst", 9, 3, 64, 30, 16, 560, 512),
    ("135M random burst", 9, 3, 64, 30, 16, 288, 0),
    ("135M, 64 requests after a shared 512", 9, 3, 64, 30, 64, 560, 512),
    ("135M, one long prompt", 9, 3, 64, 30, 1, 2000, 0),
    ("1.7B shared-prefix burst", 32, 32, 64, 24, 16, 560, 512),
    ("1.7B random burst", 32, 32, 64, 24, 16, 288, 0),
    ("4 query heads a KV head, 16 requests", 32, 8, 64, 24, 16, 500, 0),
    ("8 query heads a KV head, 4 requests", 32, 4, 64, 24, 4, 1000, 0),
]


Step = Callable[[], list[torch.Tensor]]


def step_of(kernels: CpuKernels, case: tuple[torch.Tensor, ...], pools: list[list[torch.Tensor]]) -> Step:
    """A decode step's attention with ``kernels``: every layer's pool in turn."""
    q, k, v, out_slots, kv_slots, kv_lens = case
    return lambda: [kernels.paged_decode_attention(q, k, v, out_slots, kp, vp, kv_slots, kv_lens) for kp, vp in pools]


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print("| case | base ms a step | new ms a step | speed-up | same bits |")
    print("|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for name, heads, kv_heads, d, layers, batch, length, shared in CASES:
        slots = distinct_rows(batch, length, shared) + batch
        pools = [[torch.randn(slots, kv_heads, d, generator=g).bfloat16() for _ in range(2)] for _ in range(layers)]
        q = torch.randn(batch, heads, d, generator=g)
        k, v = (torch.randn(batch, kv_heads, d, generator=g) for _ in range(2))
        case = (q, k, v, *case_slots(batch, length, shared))
        before, after = step_of(base, case, pools), step_of(new, case, pools)
        same = all(torch.equal(a, b) for a, b in zip(before(), after()))
        t = race({"base": before, "new": after}, repeats=3, rounds=9)
        print(f"| {name} ({batch} x {length} keys, {shared} shared, {heads}/{kv_heads} heads, {layers} layers) "
              f"| {1e3 * t['base']:.2f} | {1e3 * t['new']:.2f} | {t['base'] / t['new']:.2f}x | {same} |")  # fmt: skip


if __name__ == "__main__":
    main()
