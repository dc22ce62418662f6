"""Decode attention, this tree's kernels against those of an earlier commit, two builds in one process,
alternating (7 rounds, median): ms per decode step's attention over all layers of the model's shape.

Run from the repository root: python docs/benchmarks/session26-amd/attn_ab.py [BASE_COMMIT] (default 9f4cf56,
session 25's last commit). The avx512 build: an AVX-512 VNNI CPU."""

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from minisgl.kernels import native

base = sys.argv[1] if len(sys.argv) > 1 else "9f4cf56"
new = native.load_variant("avx512")
old_src = Path(tempfile.mkdtemp(prefix="attn_ab-"))
for source in native.SOURCE_DIR.iterdir():
    shown = subprocess.run(
        ["git", "show", f"{base}:minisgl/kernels/cpu/{source.name}"], capture_output=True, text=True, check=True
    )
    (old_src / source.name).write_text(shown.stdout)
old = native.load_sources("avx512", old_src)


def case(heads: int, kv_heads: int, d: int, layers: int, batch: int, prefix: int, own: int) -> Callable:
    """A step over `layers` layers' bf16 pools: `batch` requests, each `prefix` shared keys and `own` of its own."""
    g = torch.Generator().manual_seed(0)
    length, distinct = prefix + own, prefix + batch * own
    slots = distinct + batch
    pools = [[torch.randn(slots, kv_heads, d, generator=g).bfloat16() for _ in range(2)] for _ in range(layers)]
    q = torch.randn(batch, heads, d, generator=g)
    k, v = torch.randn(batch, kv_heads, d), torch.randn(batch, kv_heads, d)
    out_slots = torch.arange(distinct, slots)
    shared = torch.arange(prefix).expand(batch, prefix)
    kv_slots = torch.cat([shared, prefix + torch.arange(batch * own).view(batch, own)], 1)
    kv_lens = torch.full((batch,), length)

    def step(kernels: native.CpuKernels) -> None:
        for k_pool, v_pool in pools:
            kernels.paged_decode_attention(q, k, v, out_slots, k_pool, v_pool, kv_slots, kv_lens)

    return step


CASES = [
    ("1.7B 16 x (512 shared + 33)", (32, 32, 64, 24, 16, 512, 33)),
    ("135M 32 x (512 shared + 48)", (9, 3, 64, 30, 32, 512, 48)),
    ("1.7B 16 x 545 distinct", (32, 32, 64, 24, 16, 0, 545)),
    ("135M 1 x 2000", (9, 3, 64, 30, 1, 0, 2000)),
]
for name, args in CASES:
    step = case(*args)
    times: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(7):
        for label, kernels in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
            step(kernels)
            start = time.perf_counter()
            step(kernels)
            times[label].append(time.perf_counter() - start)
    before, after = statistics.median(times["old"]) * 1e3, statistics.median(times["new"]) * 1e3
    print(f"{name}: {base} {before:.1f} ms, this tree {after:.1f} ms, {before / after:.2f}x")
