"""Decode attention read in place from a bf16 KV pool (``kernels/cpu/paged_attention.c``) against this
machine's memory: each request's K and V rows read by the kernel, and a plain sum over the same rows.

Each case is B requests x L keys (in slot order, as a prompt's prefill leaves them), the first S of
them the same slots for every request where the case shares a prefix (a cached system prompt, read once
for them all), the rest distinct, over as many layers' pools as make POOL_BYTES, read in turn, so that
each pass reads memory, not a cache; *GB/s* is the bytes of the distinct K and V rows over the time.
*of the sum*: the kernel's rate over a plain sum's over those rows, both measured in the same round;
the median and range of ``--rounds`` rounds, the two alternating.

Run: python -m benchmarks.decode_attention [--kernels auto|c:avx2 ...] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.machine import load_average, machine_info
from minisgl.kernels.native import CpuKernels, resolve_kernels
from minisgl.kernels.variants import KERNEL_CHOICES

# All layers' K and V together: four times the 32 MiB L3 of the VMs this project measures on.
POOL_BYTES = 128 << 20
# (name, query heads, KV heads, head dim, requests, keys each, of them shared by all)
CASES = [
    ("135M, one long prompt", 9, 3, 64, 1, 2000, 0),
    ("135M, 16 requests", 9, 3, 64, 16, 500, 0),
    ("135M, 16 requests of 288 (the random burst's)", 9, 3, 64, 16, 288, 0),
    ("135M, 32 requests after a shared 512", 9, 3, 64, 32, 560, 512),
    ("1.7B, one long prompt", 32, 32, 64, 1, 2000, 0),
    ("1.7B, 16 requests", 32, 32, 64, 16, 545, 0),
    ("1.7B, 16 requests after a shared 512", 32, 32, 64, 16, 545, 512),
    ("GQA 8 KV heads x 2, 16 requests", 16, 8, 64, 16, 2000, 0),
    ("GQA 8 KV heads x 4 of 128, one prompt", 32, 8, 128, 1, 4000, 0),
]


def best_of(f: Callable[[], object], repeats: int = 5) -> float:
    f()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def distinct_rows(batch: int, length: int, shared: int) -> int:
    """The pool rows a case's requests attend, each counted once (its pool has ``batch`` more, for the new keys)."""
    return shared + batch * (length - shared)


def case_slots(batch: int, length: int, shared: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A case's out_slots, kv_slots and kv_lens: each request's keys in slot order, the first ``shared`` the same
    slots for all, its new key after every attended row."""
    distinct = distinct_rows(batch, length, shared)
    own = shared + torch.arange(batch * (length - shared)).view(batch, length - shared)
    kv_slots = torch.cat([torch.arange(shared).expand(batch, shared), own], dim=1)
    return torch.arange(distinct, distinct + batch), kv_slots, torch.full((batch,), length)


def rates(
    kernels: CpuKernels, heads: int, kv_heads: int, d: int, batch: int, length: int, shared: int, rounds: int
) -> list[tuple[float, float]]:
    """(kernel GB/s, sum GB/s) of each round for one case."""
    g = torch.Generator().manual_seed(0)
    distinct = distinct_rows(batch, length, shared)
    slots = distinct + batch
    layers = -(-POOL_BYTES // (2 * slots * kv_heads * d * 2))
    pools = [[torch.randn(slots, kv_heads, d, generator=g).bfloat16() for _ in range(2)] for _ in range(layers)]
    q = torch.randn(batch, heads, d, generator=g)
    k, v = (torch.randn(batch, kv_heads, d, generator=g) for _ in range(2))
    out_slots, kv_slots, kv_lens = case_slots(batch, length, shared)

    def attend() -> None:
        for k_pool, v_pool in pools:
            kernels.paged_decode_attention(q, k, v, out_slots, k_pool, v_pool, kv_slots, kv_lens)

    def read() -> None:
        for k_pool, v_pool in pools:
            k_pool[:distinct].sum()
            v_pool[:distinct].sum()

    gigabytes = 2 * distinct * kv_heads * d * 2 * layers / 1e9
    return [(gigabytes / best_of(attend), gigabytes / best_of(read)) for _ in range(rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default="c", choices=[c for c in KERNEL_CHOICES if c != "torch"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    kernels = resolve_kernels(args.kernels)
    print(f"# machine: {machine_info(torch.get_num_threads())['cpu']}, {torch.get_num_threads()} threads")
    print(f"# code path: C kernels {kernels.variant.description}")
    print(f"# load average at start: {load_average()}")
    print("| case | kernel GB/s | sum GB/s | of the sum (median, range) |")
    print("|---|---|---|---|")
    for name, heads, kv_heads, d, batch, length, shared in CASES:
        measured = rates(kernels, heads, kv_heads, d, batch, length, shared, args.rounds)
        shares = [kernel / plain for kernel, plain in measured]
        print(
            f"| {name} ({batch} x {length} keys, {heads}/{kv_heads} heads of {d}) "
            f"| {statistics.median(r[0] for r in measured):.1f} | {statistics.median(r[1] for r in measured):.1f} "
            f"| {statistics.median(shares):.2f} ({min(shares):.2f}-{max(shares):.2f}) |"
        )
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
