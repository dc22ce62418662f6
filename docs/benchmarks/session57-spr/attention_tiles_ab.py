"""Session 57: decode attention alone (``CpuKernels.paged_decode_attention``, one layer's call) with a commit's amx build
against the working tree's, in one process, on random bf16 pools in the shapes of the default model's bursts and of
the 1.7B scale model: requests after a shared 512-token system prompt, requests of their own, one long request.
Milliseconds a call, medians of 7 alternating rounds of 20 calls (``benchmarks.many_rows.race``). In the session,
0b6294c (decode attention in fp32 on Intel's cores) against ``decode_attention_tiles.patch`` (this folder; not kept),
which puts it on the tile unit:

    git apply docs/benchmarks/session57-spr/decode_attention_tiles.patch
    PYTHONPATH=. python docs/benchmarks/session57-spr/attention_tiles_ab.py --base 0b6294c
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks.many_rows import builds_to_compare, race
from minisgl.kernels.native import CpuKernels

Attention = Callable[[CpuKernels], torch.Tensor]


def attention_case(heads: int, kv_heads: int, d: int, lens: list[int], systems: list[int | None]) -> Attention:
    """One decode step's attention: request i has lens[i] keys, the first 512 of them system prompt systems[i]'s
    slots (None: all its own)."""
    slots = 16384
    k_pool, v_pool = (torch.randn(slots, kv_heads, d).bfloat16() for _ in range(2))
    free, used = torch.randperm(slots - 64), 0
    system_slots: dict[int, torch.Tensor] = {}
    rows = []
    for n, system in zip(lens, systems, strict=True):
        if system is not None and system not in system_slots:
            system_slots[system], used = free[used : used + 512], used + 512
        own = n - (0 if system is None else 512)
        row, used = free[used : used + own], used + own
        if system is not None:
            row = torch.cat([system_slots[system], row])
        rows.append(torch.nn.functional.pad(row, (0, max(lens) - n)))
    kv_slots = torch.stack(rows)
    out_slots = torch.arange(slots - len(lens), slots)
    kv_slots[torch.arange(len(lens)), torch.tensor(lens) - 1] = out_slots
    q = torch.randn(len(lens), heads, d)
    k, v = (torch.randn(len(lens), kv_heads, d) for _ in range(2))
    kv_lens = torch.tensor(lens)
    return lambda kernels: kernels.paged_decode_attention(q, k, v, out_slots, k_pool, v_pool, kv_slots, kv_lens)


def main() -> None:
    base, new = builds_to_compare(__doc__)
    torch.manual_seed(0)
    cases = {
        "135M, 32 requests: 4 system prompts of 512 + 48 own keys": attention_case(9, 3, 64, [560] * 32, [i % 4 for i in range(32)]),
        "135M, 16 requests of 272 keys of their own": attention_case(9, 3, 64, [272] * 16, [None] * 16),
        "135M, one request of 2,000 keys": attention_case(9, 3, 64, [2000], [None]),
        "1.7B, one request of 2,000 keys": attention_case(32, 32, 64, [2000], [None]),
        "1.7B, 16 requests: one system prompt of 512 + 48": attention_case(32, 32, 64, [560] * 16, [0] * 16),
    }  # fmt: skip
    print("| case | base ms | new ms | speed-up |\n|---|---|---|---|")
    for name, attend in cases.items():
        t = race({"base": lambda a=attend: a(base), "new": lambda a=attend: a(new)}, repeats=20, rounds=7)
        print(f"| {name} | {1e3 * t['base']:.3f} | {1e3 * t['new']:.3f} | {t['base'] / t['new']:.2f}x |")


if __name__ == "__main__":
    main()
