"""This machine's ceilings: matmul FLOP/s (fp32, bf16) and memory bandwidth, measured with torch.

The engine's achieved prefill FLOP/s and decode bytes/s are compared against these
(``python -m benchmarks.roofline``).

Run: python -m benchmarks.hardware_peak
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from benchmarks.machine import load_average, machine_info
from minisgl.heap import huge_page_buffer


def _best_seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_flops(dtype: torch.dtype, n: int = 2048) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / _best_seconds(lambda: torch.mm(a, b))


def memory_bandwidth(gib: float = 1.0) -> float:
    """Bytes/s of a streaming read (a sum over a tensor far larger than the caches), from huge pages where
    Linux gives them, as the engine's quantized weights are (``minisgl.heap.huge_page_buffer``): the best
    read this machine does, not one slowed by a page walk every 4 KiB."""
    x = huge_page_buffer(int(gib * 2**30) // 4 * 4).view(torch.float32).fill_(1.0)
    return x.numel() * 4 / _best_seconds(lambda: x.sum())


def measure() -> dict[str, float]:
    return {
        "fp32_gflops": matmul_flops(torch.float32) / 1e9,
        "bf16_gflops": matmul_flops(torch.bfloat16) / 1e9,
        "read_gbps": memory_bandwidth() / 1e9,
    }


def main() -> None:
    print(machine_info(torch.get_num_threads()))
    print(f"load average: {load_average()}")
    for name, value in measure().items():
        print(f"{name:>12}: {value:8.1f}")


if __name__ == "__main__":
    main()
