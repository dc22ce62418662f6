"""Session 29: the amx build's prefill paths against the avx512 build's, one kernel call at a time, both
libraries loaded in one process and alternating (5 rounds, the median).

- Products: the 135M and 1.7B projections at the row counts a prefill pass gives them (the MLP's in bands of
  256 rows; the attention's up to a pass's 2,048 tokens at 135M, 1,024 at 1.7B): ``int4_gemm`` (one int8 digit,
  the avx512 build's prefill path) against ``int4_gemm_bf16`` (AMX-BF16).
- Prefill attention over a fresh prompt: ``prefill_attention`` of each build (AVX-512 BF16's ``vdpbf16ps``
  against AMX-BF16's tile products).

    PYTHONPATH=. python docs/benchmarks/session29-spr/tile_ab.py
"""

from __future__ import annotations

from functools import partial

import torch

from benchmarks.machine import machine_info
from benchmarks.many_rows import PREFILL_PRODUCTS, race
from minisgl.kernels.native import load_variant
from minisgl.layers.quant import Int4Weight

ATTENTION = [("135M", 9, 3, 64, 2000), ("1.7B", 32, 32, 64, 1024)]  # name, heads, KV heads, head_dim, tokens


def main() -> None:
    avx512, amx = load_variant("avx512"), load_variant("amx")
    print(f"# {machine_info(torch.get_num_threads())['cpu']}, {torch.get_num_threads()} threads; "
          f"builds: {avx512.variant.description} / {amx.variant.description}")  # fmt: skip
    print("| product | rows | avx512: int4_gemm ms | amx: int4_gemm_bf16 ms | speed-up | amx GFLOP/s |")
    print("|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for name, n, k, rows in PREFILL_PRODUCTS:
        w = Int4Weight.quantize(torch.randn(n, k, generator=g))
        x = torch.randn(rows, k, generator=g)
        integer = avx512.int4(w.codes, w.scale, w.minimum, n)
        tiles = amx.int4(w.codes, w.scale, w.minimum, n)
        t = race({"int": partial(integer, x), "bf16": partial(tiles, x, rows)})
        flops = 2 * rows * n * k
        print(f"| {name} | {rows} | {t['int'] * 1e3:.2f} | {t['bf16'] * 1e3:.2f} | {t['int'] / t['bf16']:.2f}x | "
              f"{flops / t['bf16'] / 1e9:.0f} |", flush=True)  # fmt: skip
    print()
    print("| attention | tokens | avx512 ms | amx ms | speed-up | amx GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for name, heads, kv_heads, d, n in ATTENTION:
        q = torch.randn(n, heads, d, generator=g)
        k_pool = torch.randn(n, kv_heads, d, generator=g).bfloat16()
        v_pool = torch.randn(n, kv_heads, d, generator=g).bfloat16()
        args = (q, k_pool, v_pool, torch.arange(n).view(1, n), torch.tensor([0]), torch.tensor([n]), torch.tensor([0]))
        t = race({"avx512": partial(avx512.prefill_attention, *args), "amx": partial(amx.prefill_attention, *args)})
        flops = 4 * n * (n + 1) / 2 * heads * d
        speed = f"{t['avx512'] / t['amx']:.2f}x | {flops / t['amx'] / 1e9:.0f}"
        print(f"| {name} ({heads} heads, {kv_heads} KV heads, d {d}) | {n} | {t['avx512'] * 1e3:.1f} | "
              f"{t['amx'] * 1e3:.1f} | {speed} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
