"""Session 28: the int4 product's software prefetch distance (quant_gemm.c's PREFETCH), against torch's
streaming read measured beside it, so that each round says which read mode the VM was in.

Twelve 16384 x 2048 Q4_1-shaped weights (21 MB each, 252 MB in all, in a huge-page arena as the engine
holds them) are multiplied in turn by ROWS rows of x, as a step runs its layers; per round and
distance, the best of 6 passes over all twelve: in GB/s of weight read with one row (decode), in ms
per pass with more (prefill). Builds each distance's kernels from a copy of the sources (AVX-512 VNNI
variant).

    PYTHONPATH=. python docs/benchmarks/session28-amd/prefetch_sweep.py [--rounds 6] [--rows 1]
        [--distances 1024 2048 4096 8192]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from fused_prefetch_ab import sources_with_prefetch  # this folder's: the script's own directory is on the path

from benchmarks.hardware_peak import memory_bandwidth
from benchmarks.machine import machine_info
from minisgl.heap import HugePageArena, retain_freed_memory
from minisgl.kernels import native
from minisgl.layers.quant import Int4Weight


def kernels_with_prefetch(distance: int, root: Path) -> native.CpuKernels:
    return native.load_sources("avx512", sources_with_prefetch(distance, root))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--distances", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    args = p.parse_args()
    rounds, distances = args.rounds, args.distances
    retain_freed_memory()
    torch.manual_seed(0)
    arena = HugePageArena()
    weights = []
    for _ in range(12):
        w = Int4Weight.quantize(torch.randn(16384, 2048) * 0.02)
        w.move_into(arena)
        weights.append(w)
    nbytes = sum(sum(b.numel() * b.element_size() for b in w.buffers()) for w in weights)
    x = torch.randn(args.rows, 2048)
    with tempfile.TemporaryDirectory() as tmp:
        products = {}
        for d in distances:
            kernels = kernels_with_prefetch(d, Path(tmp))
            products[d] = [w.bind(kernels, 1) for w in weights]
        print(f"# {machine_info(torch.get_num_threads())['cpu']}, {torch.get_num_threads()} threads; "
              f"{nbytes / 1e6:.0f} MB of weights; C kernels {kernels.variant.description}")  # fmt: skip
        unit = "GB/s" if args.rows == 1 else "ms"
        print(f"# {args.rows} row(s) of x")
        print("| round | torch read GB/s | " + " | ".join(f"PREFETCH {d} {unit}" for d in distances) + " |")
        print("|---|---|" + "---|" * len(distances))
        with torch.inference_mode():
            for r in range(rounds):
                read = memory_bandwidth(0.5) / 1e9
                rates = []
                for d in distances[r % len(distances) :] + distances[: r % len(distances)]:
                    best = float("inf")
                    for _ in range(6):
                        start = time.perf_counter()
                        for product in products[d]:
                            product(x)
                        best = min(best, time.perf_counter() - start)
                    rates.append((d, nbytes / best / 1e9 if args.rows == 1 else best * 1e3))
                by_distance = dict(rates)
                print(
                    f"| {r} | {read:.1f} | " + " | ".join(f"{by_distance[d]:.1f}" for d in distances) + " |", flush=True
                )


if __name__ == "__main__":
    main()
