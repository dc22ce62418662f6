"""Session 32: the greedy sampler's kernel, torch.argmax against max's indices (the same tokens), over
[rows, 49,152] fp32 logits (the default model's vocabulary), best of 5 rounds of 200 calls each, on the
torch threads this process has (2 on the VMs here).

    PYTHONPATH=. python docs/benchmarks/session32-spr/argmax.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from benchmarks.machine import machine_info


def best_of(f: Callable[[], object]) -> float:
    f()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(200):
            f()
        times.append((time.perf_counter() - start) / 200)
    return min(times)


def main() -> None:
    print(
        f"# {machine_info(torch.get_num_threads())['cpu']}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print("| rows | argmax (us) | max's indices (us) | argmax / max |")
    print("|---|---|---|---|")
    for rows in (1, 4, 16, 32, 64):
        logits = torch.randn(rows, 49152, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(logits.argmax(-1), logits.max(-1).indices)
        slow = best_of(lambda: logits.argmax(-1))  # noqa: B023 - timed before the next row count
        fast = best_of(lambda: logits.max(-1).indices)  # noqa: B023
        print(f"| {rows} | {slow * 1e6:.0f} | {fast * 1e6:.0f} | {slow / fast:.2f} |")


if __name__ == "__main__":
    main()
