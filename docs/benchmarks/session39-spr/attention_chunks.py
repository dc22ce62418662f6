"""Session 39: decode attention (``paged_attention.c``) built with three smallest chunks, MIN_CHUNK_BYTES 128 KiB
(the commit before), 96 and 64 KiB, in one process, on the bursts' shapes: the read rate of the distinct K and
V rows (``benchmarks.decode_attention.rates``: 3 rounds each, two passes over the builds, medians). A group of
requests shares only the whole chunks inside the prompt they share: at 135M (384-byte rows) 128 KiB chunks are
340 keys, so 172 of a 512-token system prompt's keys were read and dotted once per member.

    PYTHONPATH=. python docs/benchmarks/session39-spr/attention_chunks.py
"""

from __future__ import annotations

import re
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.decode_attention import rates
from benchmarks.machine import load_average, machine_info
from minisgl.kernels.native import SOURCE_DIR, CpuKernels, load_sources

SMALLEST_CHUNKS_KIB = (128, 96, 64)
# (name, query heads, KV heads, head dim, requests, keys each, of them shared by all)
CASES = [
    ("135M, random burst: 16 x 288 keys", 9, 3, 64, 16, 288, 0),
    ("135M, shared burst: 32 x 560 keys after a shared 512", 9, 3, 64, 32, 560, 512),
    ("135M, shared burst's first steps: 32 x 545 after a shared 512", 9, 3, 64, 32, 545, 512),
    ("135M, 16 x 500 keys", 9, 3, 64, 16, 500, 0),
    ("135M, one long prompt: 1 x 2000 keys", 9, 3, 64, 1, 2000, 0),
    ("1.7B, 16 x 545 after a shared 512", 32, 32, 64, 16, 545, 512),
    ("1.7B, 16 x 545", 32, 32, 64, 16, 545, 0),
]


def build(kib: int) -> CpuKernels:
    sources = Path(tempfile.mkdtemp()) / "cpu"
    shutil.copytree(SOURCE_DIR, sources)
    path = sources / "paged_attention.c"
    text = re.sub(
        r"#define MIN_CHUNK_BYTES \(\d+ \* 1024\)", f"#define MIN_CHUNK_BYTES ({kib} * 1024)", path.read_text()
    )
    path.write_text(text)
    return load_sources("amx", sources)


def main() -> None:
    print(
        f"# machine: {machine_info(torch.get_num_threads())['cpu']}, {torch.get_num_threads()} threads; the amx build"
    )
    print(f"# load average at start: {load_average()}")
    builds = {kib: build(kib) for kib in SMALLEST_CHUNKS_KIB}
    print("| case | " + " | ".join(f"{kib} KiB GB/s" for kib in builds) + " |")
    print("|---|" + "---|" * len(builds))
    for name, *shape in CASES:
        measured: dict[int, list[float]] = {kib: [] for kib in builds}
        for _ in range(2):
            for kib, kernels in builds.items():
                measured[kib] += [kernel for kernel, _ in rates(kernels, *shape, 3)]
        first = statistics.median(measured[SMALLEST_CHUNKS_KIB[0]])
        cells = [f"{statistics.median(m):.1f} ({statistics.median(m) / first:.2f}x)" for m in measured.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
