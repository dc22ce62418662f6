"""Session 37: decode attention of the default model's and a 1.7B model's shapes through the decode kernel
(``paged_decode_attention``: fp32 queries, vector units) against the prefill kernel asked for one new token
per request (``store_kv`` then ``prefill_attention``, its prefix the request's keys: bf16 queries and
weights, AMX-BF16 tiles in the amx build): whether the tile unit's kernel, as it is, would serve decode.
Each case is benchmarks.decode_attention's (B requests x L keys, the first S shared), over all layers' pools
in turn; best of 5 each, the two alternating; *rel. diff.*: the largest difference of one layer's outputs
over the largest output.

    PYTHONPATH=. python docs/benchmarks/session37-spr/attention_paths.py
"""

from __future__ import annotations

import time

import torch

from benchmarks.decode_attention import case_slots, distinct_rows
from benchmarks.machine import load_average, machine_info
from minisgl.kernels.native import CpuKernels, load_variant

# (name, query heads, KV heads, head dim, requests, keys each, of them shared, layers)
CASES = [
    ("135M, 16 requests", 9, 3, 64, 16, 290, 0, 30),
    ("135M, 32 requests after a shared 512", 9, 3, 64, 32, 560, 512, 30),
    ("135M, one request", 9, 3, 64, 1, 2000, 0, 30),
    ("1.7B, 16 requests", 32, 32, 64, 16, 300, 0, 24),
    ("1.7B, 16 requests after a shared 512", 32, 32, 64, 16, 545, 512, 24),
    ("1.7B, one request", 32, 32, 64, 1, 2000, 0, 24),
]


def measure(kernels: CpuKernels, case: tuple[str, int, int, int, int, int, int, int], g: torch.Generator) -> str:
    """One case's table row."""
    name, heads, kv_heads, d, batch, length, shared, layers = case
    slots = distinct_rows(batch, length, shared) + batch
    pools = [[torch.randn(slots, kv_heads, d, generator=g).bfloat16() for _ in range(2)] for _ in range(layers)]
    q = torch.randn(batch, heads, d, generator=g)
    k, v = (torch.randn(batch, kv_heads, d, generator=g) for _ in range(2))
    out_slots, kv_slots, kv_lens = case_slots(batch, length, shared)
    starts, ones = torch.arange(batch), torch.ones(batch, dtype=torch.int64)

    def decode(pool: list[torch.Tensor]) -> torch.Tensor:
        return kernels.paged_decode_attention(q, k, v, out_slots, *pool, kv_slots, kv_lens).view(batch, -1)

    def prefill(pool: list[torch.Tensor]) -> torch.Tensor:
        kernels.store_kv(k, v, out_slots, *pool)
        return kernels.prefill_attention(q, *pool, kv_slots, starts, ones, kv_lens - 1)

    diff = ((decode(pools[0]) - prefill(pools[0])).abs().max() / decode(pools[0]).abs().max()).item()
    best = {"decode": float("inf"), "prefill": float("inf")}
    for _ in range(5):
        for path, run in (("decode", decode), ("prefill", prefill)):
            start = time.perf_counter()
            for pool in pools:
                run(pool)
            best[path] = min(best[path], time.perf_counter() - start)
    return (f"| {name} ({batch} x {length} keys, {shared} shared) | {1000 * best['decode']:.2f} "
            f"| {1000 * best['prefill']:.2f} | {best['prefill'] / best['decode']:.2f}x | {diff:.1e} |")  # fmt: skip


def main() -> None:
    kernels = load_variant("amx")
    print(f"# {machine_info(torch.get_num_threads())}")
    print(f"# code path: C kernels {kernels.variant.description}; load average at start: {load_average()}")
    print("| case | decode kernel ms a step | prefill kernel ms a step | decode's speed over it | rel. diff. |")
    print("|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for case in CASES:
        print(measure(kernels, case, g), flush=True)
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
