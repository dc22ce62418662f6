"""Prefill attention per layer (the avx512 build's bf16 kernel): ms and GFLOP/s over the causal query-key pairs
(4 x head_dim x heads FLOP each) for the 135M and 1.7B shapes; with a FOLDER, also a build of the C sources
there, alternating, and whether the bits agree.

Run from the repository root: python docs/benchmarks/session27-amd/prefill_attention_rate.py [FOLDER]"""

import statistics
import sys
import time
from pathlib import Path

import torch

from minisgl.kernels import native

other = Path(sys.argv[1]) if len(sys.argv) > 1 else None
base = native.load_variant("avx512")
builds = {"base": base}
if other:
    native.SOURCE_DIR = other
    native.load_variant.cache_clear()
    builds["mod"] = native.load_variant("avx512")
torch.manual_seed(0)
CASES = [
    ("135M 1x2000", 9, 3, 64, 1, 2000, 0),
    ("135M 8x256", 9, 3, 64, 8, 256, 0),
    ("1.7B 1x1024", 32, 32, 64, 1, 1024, 0),
    ("135M 16x64 after 512 shared", 9, 3, 64, 16, 64, 512),
]
for name, heads, kvh, d, batch, new, prefix in CASES:
    n = prefix + new
    slots = prefix + batch * new
    kp, vp = torch.randn(slots, kvh, d).bfloat16(), torch.randn(slots, kvh, d).bfloat16()
    q = torch.randn(batch * new, heads, d)
    kv_slots = torch.stack(
        [torch.cat([torch.arange(prefix), prefix + b * new + torch.arange(new)]) for b in range(batch)]
    )
    q_starts = torch.arange(batch) * new
    new_lens = torch.full((batch,), new)
    prefix_lens = torch.full((batch,), prefix)
    pairs = batch * sum(prefix + t + 1 for t in range(new))
    flops = pairs * 4 * d * heads
    outs = {k: b.prefill_attention(q, kp, vp, kv_slots, q_starts, new_lens, prefix_lens) for k, b in builds.items()}
    same = all(torch.equal(outs["base"], o) for o in outs.values())
    res = {k: [] for k in builds}
    for rep in range(10):
        for k in list(builds) if rep % 2 == 0 else list(builds)[::-1]:
            t = time.perf_counter()
            builds[k].prefill_attention(q, kp, vp, kv_slots, q_starts, new_lens, prefix_lens)
            res[k].append(time.perf_counter() - t)
    line = f"{name}: " + ", ".join(
        f"{k} {statistics.median(v) * 1e3:.2f} ms ({flops / statistics.median(v) / 1e9:.0f} GFLOP/s)"
        for k, v in res.items()
    )
    if other:
        line += f" speed-up {statistics.median(res['base']) / statistics.median(res['mod']):.3f} same {same}"
    print(line, flush=True)
