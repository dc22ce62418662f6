"""Session 39: an MLP's prefill rows, an earlier commit's amx build (gate_up's product written out in fp32, then
the down projection's product taking it, ``int4_gemm_bf16_swiglu``: SwiGLU computed as x is laid out for the
tiles) against the working tree's ``prefill_mlp`` (one call; gate_up's sums leave the tiles as the activation,
in bf16, never written out). Both libraries loaded in one process and alternating (9 rounds of 3 calls, the
median), the outputs checked equal, bit for bit. Int4 weights in the default model's and the 1.7B scale
model's shapes, at the rows of an MLP band (``tuning.mlp_band_rows``).

    PYTHONPATH=. python docs/benchmarks/session39-spr/prefill_mlp_ab.py --base 608e380
"""

from __future__ import annotations

import torch

from benchmarks.many_rows import builds_to_compare, race
from minisgl.kernels.native import CpuKernels
from minisgl.layers.quant import Int4Weight
from minisgl.tuning import mlp_band_rows

SHAPES = [("135M", 576, 1536), ("1.7B", 2048, 8192)]  # hidden, intermediate


def compare(base: CpuKernels, new: CpuKernels, name: str, hidden: int, intermediate: int, g: torch.Generator) -> None:
    gate_up = Int4Weight.quantize(torch.randn(2 * intermediate, hidden, generator=g))
    down = Int4Weight.quantize(torch.randn(hidden, intermediate, generator=g))
    gate_up_product, down_buffers = gate_up.bind(base, 1), down.kernel_buffers()
    mlp = new.prefill_mlp(gate_up.kernel_buffers(), down_buffers, hidden, intermediate)
    rows = mlp_band_rows(intermediate)
    x, out = torch.randn(rows, hidden, generator=g), torch.empty(rows, hidden)

    def two_products() -> torch.Tensor:
        gate_up_rows = gate_up_product(x, rows)  # held here: the call reads it
        args = (base.pointer(gate_up_rows), rows, intermediate, *map(base.pointer, down_buffers), hidden)
        code = base.lib.int4_gemm_bf16_swiglu(*args, base.pointer(out), torch.get_num_threads())
        base.raise_for("int4_gemm_bf16_swiglu", code)
        return out

    same = torch.equal(two_products().clone(), mlp(x))
    t = race({"base": two_products, "new": lambda: mlp(x, out)}, repeats=3, rounds=9)
    print(f"| {name} | {rows} | {1e3 * t['base']:.2f} | {1e3 * t['new']:.2f} | {t['base'] / t['new']:.2f}x | {same} |")


def main() -> None:
    base, new = builds_to_compare(__doc__)
    print("| MLP | rows | base ms | new ms | speed-up | same bits |")
    print("|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for name, hidden, intermediate in SHAPES:
        compare(base, new, name, hidden, intermediate, g)


if __name__ == "__main__":
    main()
