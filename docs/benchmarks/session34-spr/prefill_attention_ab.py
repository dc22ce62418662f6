"""Session 34: prefill attention (``prefill_attention.c``), the amx build of an earlier commit's kernel sources
against the working tree's, both libraries loaded in one process and alternating (``benchmarks.many_rows.race``:
7 rounds of 3 calls, the median). One fresh prompt (or one extending a cached prefix) of each shape, its keys and
values at random slots of a bf16 pool; the outputs compared: the softmax weights' 2^x changed this session,
so the bits differ from the earlier commit's, and the largest difference relative to the largest output is
printed with the error of each against exact (fp64) attention of the bf16-rounded queries.

    PYTHONPATH=. python docs/benchmarks/session34-spr/prefill_attention_ab.py --base dc2cccd
"""

from __future__ import annotations

from functools import partial

import torch

from benchmarks.many_rows import builds_to_compare, race
from minisgl.kernels.native import CpuKernels

# (name, new tokens, cached prefix, query heads, KV heads, head_dim)
CASES = [
    ("135M, a 2,000-token prompt", 2000, 0, 9, 3, 64),
    ("135M, 256 tokens after a cached 512", 256, 512, 9, 3, 64),
    ("1.7B, a 1,024-token pass", 1024, 0, 32, 32, 64),
    ("GQA 32/8 heads of 128, a 1,024-token pass", 1024, 0, 32, 8, 128),
]


def exact(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, prefix: int) -> torch.Tensor:
    """fp64 causal attention of bf16-rounded queries over the pool's keys and values → [tokens, heads * d]."""
    group = q.shape[1] // keys.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1).transpose(0, 1) for t in (keys, values))  # [heads, n, d]
    scores = q.bfloat16().double().transpose(0, 1) @ k.transpose(1, 2) / q.shape[2] ** 0.5  # [heads, tokens, n]
    seen = torch.arange(k.shape[1]).unsqueeze(0) <= prefix + torch.arange(q.shape[0]).unsqueeze(1)
    return (scores.masked_fill(~seen, float("-inf")).softmax(-1) @ v).transpose(0, 1).flatten(1)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def attend(kernels: CpuKernels, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return kernels.prefill_attention(*inputs)


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print("| case | base ms | new ms | speed-up | base / new difference | base vs exact | new vs exact |")
    print("|---|---|---|---|---|---|---|")
    for name, n, prefix, heads, kv_heads, d in CASES:
        g = torch.Generator().manual_seed(n + heads)
        slots = prefix + n + 64
        k_pool, v_pool = (torch.randn(slots, kv_heads, d, generator=g).bfloat16() for _ in range(2))
        q = torch.randn(n, heads, d, generator=g)
        kv_slots = torch.randperm(slots, generator=g)[: prefix + n].unsqueeze(0).contiguous()
        inputs = (q, k_pool, v_pool, kv_slots, torch.tensor([0]), torch.tensor([n]), torch.tensor([prefix]))
        before, after = attend(base, inputs), attend(new, inputs)
        truth = exact(q, k_pool[kv_slots[0]], v_pool[kv_slots[0]], prefix)
        t = race({"base": partial(attend, base, inputs), "new": partial(attend, new, inputs)}, 3, rounds=7)
        print(f"| {name} | {t['base'] * 1e3:.2f} | {t['new'] * 1e3:.2f} | {t['base'] / t['new']:.2f}x | "
              f"{relative(after, before):.1e} | {relative(before, truth):.1e} | {relative(after, truth):.1e} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
