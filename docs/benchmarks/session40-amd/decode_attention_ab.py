"""Session 40: decode attention (``paged_attention.c``) with bf16 products against a commit's fp32 products, one
process, the host's best build without a tile unit (``avx512``, or ``--variant``): the read rate of the distinct K
and V rows per case (``benchmarks.decode_attention.rates``, 3 rounds each, two passes over the builds, medians).

    PYTHONPATH=. python docs/benchmarks/session40-amd/decode_attention_ab.py [--base 70babd1] [--variant avx512]
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import tarfile
import tempfile
from pathlib import Path

import torch

from benchmarks.decode_attention import rates
from benchmarks.machine import load_average, machine_info
from minisgl.kernels.native import SOURCE_DIR, CpuKernels, load_sources

# (name, query heads, KV heads, head dim, requests, keys each, of them shared by all)
CASES = [
    ("135M, random burst: 16 x 288 keys", 9, 3, 64, 16, 288, 0),
    ("135M, shared burst: 32 x 560 keys after a shared 512", 9, 3, 64, 32, 560, 512),
    ("135M, 16 x 500 keys", 9, 3, 64, 16, 500, 0),
    ("135M, one long prompt: 1 x 2000 keys", 9, 3, 64, 1, 2000, 0),
    ("1.7B, 16 x 545 after a shared 512", 32, 32, 64, 16, 545, 512),
    ("1.7B, 16 x 545", 32, 32, 64, 16, 545, 0),
    ("1.7B, one long prompt: 1 x 2000 keys", 32, 32, 64, 1, 2000, 0),
]


def commit_sources(commit: str) -> Path:
    """The kernel sources of ``commit``, in a fresh directory."""
    root = Path(tempfile.mkdtemp())
    archive = subprocess.run(
        ["git", "archive", commit, "minisgl/kernels/cpu"], check=True, capture_output=True, cwd=SOURCE_DIR.parents[2]
    ).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(root, filter="data")
    return root / "minisgl" / "kernels" / "cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="70babd1")
    parser.add_argument("--variant", default="avx512")
    args = parser.parse_args()
    print(f"# machine: {machine_info(torch.get_num_threads())['cpu']}, {torch.get_num_threads()} threads")
    print(f"# the {args.variant} build of {args.base} (fp32 products) against the working tree's (bf16 products)")
    print(f"# load average at start: {load_average()}")
    builds: dict[str, CpuKernels] = {
        args.base: load_sources(args.variant, commit_sources(args.base)),
        "bf16": load_sources(args.variant, SOURCE_DIR),
    }
    print("| case | " + " | ".join(f"{name} GB/s" for name in builds) + " |")
    print("|---|" + "---|" * len(builds))
    for name, *shape in CASES:
        measured: dict[str, list[float]] = {b: [] for b in builds}
        for _ in range(2):
            for build, kernels in builds.items():
                measured[build] += [kernel for kernel, _ in rates(kernels, *shape, 3)]
        first = statistics.median(measured[args.base])
        cells = [f"{statistics.median(m):.1f} ({statistics.median(m) / first:.2f}x)" for m in measured.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
