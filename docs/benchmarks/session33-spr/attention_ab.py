"""Session 33: decode attention (``paged_attention.c``), the amx build of an earlier commit's kernel sources
against the working tree's, both libraries loaded in one process and alternating (``benchmarks.many_rows.race``:
7 rounds of 20 calls, the median), each pair of outputs checked equal bit for bit. One layer's bf16 pool, so
the rows are mostly in the caches: this times the arithmetic; ``python -m benchmarks.decode_attention`` times
it against the memory. The cases are ``benchmarks.decode_attention``'s at 135M and 1.7B.

    PYTHONPATH=. python docs/benchmarks/session33-spr/attention_ab.py --base a11829a
"""

from __future__ import annotations

from functools import partial

import torch

from benchmarks.decode_attention import CASES, case_slots, distinct_rows
from benchmarks.many_rows import builds_to_compare, race
from minisgl.kernels.native import CpuKernels


def attend(kernels: CpuKernels, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return kernels.paged_decode_attention(*inputs)


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print("| case | base us | new us | speed-up | same bits |")
    print("|---|---|---|---|---|")
    for name, heads, kv_heads, d, batch, length, shared in CASES:
        if not name.startswith(("135M", "1.7B")):
            continue
        g = torch.Generator().manual_seed(0)
        slots = distinct_rows(batch, length, shared) + batch
        k_pool, v_pool = (torch.randn(slots, kv_heads, d, generator=g).bfloat16() for _ in range(2))
        q = torch.randn(batch, heads, d, generator=g)
        k, v = (torch.randn(batch, kv_heads, d, generator=g) for _ in range(2))
        out_slots, kv_slots, kv_lens = case_slots(batch, length, shared)
        inputs = (q, k, v, out_slots, k_pool, v_pool, kv_slots, kv_lens)
        same = torch.equal(attend(base, inputs), attend(new, inputs))
        t = race({"base": partial(attend, base, inputs), "new": partial(attend, new, inputs)}, 20, rounds=7)
        print(f"| {name} | {t['base'] * 1e6:.0f} | {t['new'] * 1e6:.0f} | {t['base'] / t['new']:.2f}x | {same} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
