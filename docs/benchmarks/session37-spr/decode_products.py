"""Session 37: the products of one decode step of the default model's shape (30 layers' qkv, o, gate_up and
down, int4, then the int8 LM head at two digits) at several batch sizes, each weight its own (so that a
step streams them from memory, as a decode step does), through the C kernels' two paths:

- decode rows' (``quant_gemm.c``: x rounded to int8 digits; AVX-512 VNNI up to 8 rows, AMX-INT8 sums and a
  vector epilogue per group of 32 from 9 rows on), the path every decode row takes;
- prefill rows' (``bf16_gemm.c``, the amx build: the weight dequantized to bf16 for AMX-BF16 tiles).

*GB/s*: the weights' bytes (codes, scales, minimums) over the step's time. Medians of ``--rounds`` rounds,
the two paths alternating; each round checks nothing but time (the tests check the values).

    PYTHONPATH=. python docs/benchmarks/session37-spr/decode_products.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.machine import load_average, machine_info
from minisgl.heap import retain_freed_memory
from minisgl.kernels.native import Matmul, load_variant
from minisgl.layers.quant import Int4Weight, Int8Weight, QuantizedWeight

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
LAYERS, VOCAB, HIDDEN = 30, 49152, 576


def weight_bytes(w: QuantizedWeight) -> int:
    return sum(b.numel() * b.element_size() for b in w.buffers())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 9, 16, 32])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    retain_freed_memory()
    torch.manual_seed(0)
    kernels = load_variant("amx")
    print(f"# {machine_info(torch.get_num_threads())}")
    print(f"# code path: C kernels {kernels.variant.description}; load average at start: {load_average()}")
    weights: list[QuantizedWeight] = [Int4Weight.quantize(torch.randn(n, k) * 0.02) for _ in range(LAYERS)
                                      for n, k in SHAPES]  # fmt: skip
    head = Int8Weight.quantize(torch.randn(VOCAB, HIDDEN) * 0.02)
    products: list[tuple[Matmul, int]] = [(w.bind(kernels, 1), w.in_features) for w in weights]
    products.append((head.bind(kernels, 2), HIDDEN))
    total = sum(weight_bytes(w) for w in weights) + weight_bytes(head)
    print(f"# weights read a step: {total / 2**20:.1f} MiB")
    print("| rows | decode rows' path ms | GB/s | prefill rows' path (bf16 tiles) ms | GB/s |")
    print("|---|---|---|---|---|")
    with torch.inference_mode():
        for rows in args.rows:
            xs = {k: torch.randn(rows, k) for k in {k for _, k in SHAPES}}

            def step(prefill_rows: int, xs: dict[int, torch.Tensor] = xs) -> None:
                for matmul, k in products:
                    matmul(xs[k], prefill_rows)

            times: dict[int, list[float]] = {0: [], rows: []}
            for prefill_rows in times:
                step(prefill_rows)  # warm-up: the kernels' buffers
            for _ in range(args.rounds):
                for prefill_rows, measured in times.items():
                    start = time.perf_counter()
                    step(prefill_rows)
                    measured.append(time.perf_counter() - start)
            decode, prefill = (statistics.median(times[p]) for p in (0, rows))
            print(f"| {rows} | {1000 * decode:.2f} | {total / decode / 1e9:.1f} | {1000 * prefill:.2f} "
                  f"| {total / prefill / 1e9:.1f} |")  # fmt: skip
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
