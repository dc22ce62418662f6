"""Session 31: quant_gemm.c's int4 products with one digit of x at 8, 16 and 32 rows (decode batches), timed as
amx_int8_decode.c times its prototype (best of 30 calls after one warm-up, the engine's two threads), on the
1.7B gate/up and down shapes and the 135M gate/up (random weights, quantized as Int4Weight does).

    PYTHONPATH=. python docs/benchmarks/session31-spr/decode_rows_16.py
"""

from __future__ import annotations

import time

import torch

from benchmarks.machine import machine_info
from minisgl.kernels.native import resolve_kernels
from minisgl.kernels.variants import cpu_flags
from minisgl.layers.quant import Int4Weight

SHAPES = [("1.7B gate_up", 16384, 2048), ("1.7B down", 2048, 8192), ("135M gate_up", 3072, 576)]


def main() -> None:
    kernels = resolve_kernels("c")
    amx = " ".join(sorted(f for f in cpu_flags() if f.startswith("amx"))) or "none"
    print(f"# {machine_info(torch.get_num_threads())['cpu']}, AMX: {amx}; {torch.get_num_threads()} threads; "
          f"quant_gemm.c's {kernels.variant.name} build ({kernels.variant.description})")  # fmt: skip
    torch.manual_seed(0)
    for name, n, k in SHAPES:
        product = Int4Weight.quantize(torch.randn(n, k) * 0.02).bind(kernels, 1)
        for rows in (8, 16, 32):
            x = torch.randn(rows, k)
            product(x)
            best = float("inf")
            for _ in range(30):
                start = time.perf_counter()
                product(x)
                best = min(best, time.perf_counter() - start)
            print(f"{name} (N {n} K {k}), {rows} rows: {best * 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
