"""Session 34: the greedy sampler's argmax over [rows, 49,152] fp32 logits (the default model's vocabulary):
torch.argmax, torch.max's indices (the sampler's before) and the C kernels' argmax (``argmax.c``, the best
build this CPU runs), the same indices checked; best of 5 rounds of 200 calls each, on the torch threads this
process has (2 on the VMs here). The logits are written before every call, as the LM head writes them before
the sampler reads them.

    PYTHONPATH=. python docs/benchmarks/session34-spr/argmax.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from benchmarks.machine import machine_info
from minisgl.kernels.native import resolve_kernels


def best_of(f: Callable[[torch.Tensor], object], logits: torch.Tensor, fresh: torch.Tensor) -> float:
    times = []
    for _ in range(5):
        elapsed = 0.0
        for _ in range(200):
            logits.copy_(fresh)
            start = time.perf_counter()
            f(logits)
            elapsed += time.perf_counter() - start
        times.append(elapsed / 200)
    return min(times)


def main() -> None:
    kernels = resolve_kernels("c")
    assert kernels is not None
    print(f"# {machine_info(torch.get_num_threads())['cpu']}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, C kernels: {kernels.variant.name}")  # fmt: skip
    print("| rows | torch.argmax (us) | max's indices (us) | C argmax (us) | max's / C's |")
    print("|---|---|---|---|---|")
    for rows in (1, 9, 16, 32, 64):
        fresh = torch.randn(rows, 49152, generator=torch.Generator().manual_seed(rows))
        logits = fresh.clone()
        assert torch.equal(kernels.argmax(logits), logits.max(-1).indices)
        assert torch.equal(logits.argmax(-1), logits.max(-1).indices)
        calls = (lambda x: x.argmax(-1), lambda x: x.max(-1).indices, kernels.argmax)
        times = [best_of(f, logits, fresh) for f in calls]
        print(f"| {rows} | {times[0] * 1e6:.0f} | {times[1] * 1e6:.0f} | {times[2] * 1e6:.0f} | "
              f"{times[1] / times[2]:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
