"""The quantized weights' product paths per weight, at several row counts, on the projections of the
default model and of a 1.7B one (SmolLM2-1.7B's shapes): the C kernel (``quant_gemm.c``, every row
count; x at one int8 digit, as every layer's products take it, and at two, as the LM head's; with the
amx build its prefill rows' path too, bf16 on AMX: ``bf16_gemm.c``), torch's
weight-only kernel and the weight expanded to bf16 with torch's bf16 GEMM (the fallback without the C
kernels), and dense packed bf16 and fp32 products beside them.
``INT4_MAX_KERNEL_ROWS`` / ``INT8_MAX_KERNEL_ROWS`` (``minisgl/tuning.py``: where torch's kernel stops
beating the expansion) are set from the "torch faster" column.

Run: python -m benchmarks.many_rows [--rows 1 8 16 32 64 512] [--threads N] [--kernels auto|c:avx2 ...]
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from benchmarks.machine import amx_flags, load_average, machine_info
from minisgl.heap import retain_freed_memory
from minisgl.kernels.native import CpuKernels, load_sources, load_variant, resolve_kernels
from minisgl.kernels.variants import KERNEL_CHOICES, cpu_flags
from minisgl.layers.linear import Linear, pack_weights
from minisgl.layers.quant import DequantBuffer, Int4Weight, Int8Weight, QuantizedWeight
from minisgl.tuning import DEQUANT_BUFFER_ELEMENTS, mlp_band_rows

# (name, out, in): the fused projections of a layer, and the LM head.
SHAPES = {
    "135M": [("qkv", 960, 576), ("gate_up", 3072, 576), ("down", 576, 1536), ("lm_head", 49152, 576)],
    "1.7B": [("qkv", 6144, 2048), ("gate_up", 16384, 2048), ("down", 2048, 8192), ("lm_head", 49152, 2048)],
}


# The layers' products at the row counts a prefill pass gives them (name, out, in, rows): the MLP's in its
# bands (``mlp_band_rows``), the attention's up to a pass's tokens (2,048 at 135M, 1,024 at 1.7B). For A/B
# runs of two builds or two commits' kernels (docs/benchmarks/session29-spr/tile_ab.py, session30-spr/kernel_ab.py).
PREFILL_PRODUCTS = [
    ("135M qkv", 960, 576, 2048), ("135M o", 576, 576, 2048), ("135M gate_up", 3072, 576, mlp_band_rows(1536)),
    ("135M down", 576, 1536, mlp_band_rows(1536)), ("1.7B qkv", 6144, 2048, 1024), ("1.7B o", 2048, 2048, 1024),
    ("1.7B gate_up", 16384, 2048, mlp_band_rows(8192)), ("1.7B down", 2048, 8192, mlp_band_rows(8192)),
]  # fmt: skip


def kernels_at(commit: str, variant: str) -> CpuKernels:
    """The ``variant`` build of ``commit``'s kernel sources (``git archive`` of ``minisgl/kernels/cpu``), bound
    through that commit's own header: the baseline of an A/B against the working tree's build."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", commit, "minisgl/kernels/cpu"], capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        return load_sources(variant, Path(tmp) / "minisgl/kernels/cpu")


def builds_to_compare(doc: str) -> tuple[CpuKernels, CpuKernels]:
    """An A/B script's start (``doc``: its help): ``--base COMMIT`` and ``--variant`` (default: this CPU's best
    build) parsed, that commit's build and the working tree's loaded, and a header printed with the machine, its
    AMX flags, the threads and the load average. Returns (the commit's build, the working tree's)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the commit whose kernel sources are the baseline")
    parser.add_argument("--variant", help="the build to compare (default: the one this CPU runs)")
    args = parser.parse_args()
    variant = args.variant
    if variant is None:
        host = resolve_kernels("c")  # raises where no build runs here
        assert host is not None
        variant = host.variant.name
    base, new = kernels_at(args.base, variant), load_variant(variant)
    threads = torch.get_num_threads()
    print(f"# {machine_info(threads)['cpu']}, AMX: {amx_flags()}; {threads} threads; the {variant} build "
          f"({new.variant.description}) of {args.base} against the working tree's; load average {load_average()}")  # fmt: skip
    return base, new


def race(calls: dict[str, Callable[[], object]], repeats: int = 1, rounds: int = 5) -> dict[str, float]:
    """Median seconds a call of each, over ``rounds`` rounds of ``repeats`` calls, the calls alternating
    (after one warm-up each), so that a drift of the machine's speed falls on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            times[name].append((time.perf_counter() - start) / repeats)
    return {name: statistics.median(t) for name, t in times.items()}


PRODUCTS_AB_HEADER = "| product | rows | base ms | new ms | speed-up | same bits |\n|---|---|---|---|---|---|"


Product = Callable[[torch.Tensor], torch.Tensor]


def race_products(
    name: str, x: torch.Tensor, before: Product, after: Product, repeats: int | None = None, checks: int = 1
) -> None:
    """One row of a build A/B's table (``PRODUCTS_AB_HEADER``) for the two builds' products (``before``, ``after``)
    of the rows ``x``: checked equal bit for bit over ``checks`` calls each, then ``race``d, 9 rounds of ``repeats``
    calls (by default 20 for decode rows, 3 for more than 32)."""
    same = all(torch.equal(before(x), after(x)) for _ in range(checks))
    repeats = repeats or (20 if len(x) <= 32 else 3)
    t = race({"base": lambda: before(x), "new": lambda: after(x)}, repeats=repeats, rounds=9)
    speed_up = t["base"] / t["new"]
    print(f"| {name} | {len(x)} | {1e3 * t['base']:.3f} | {1e3 * t['new']:.3f} | {speed_up:.2f}x | {same} |")


def seconds(f: Callable[[], object], min_time: float = 0.3) -> float:
    f()  # warm up: packed copies, first-touch of buffers
    start, n = time.perf_counter(), 0
    while (elapsed := time.perf_counter() - start) < min_time or n < 3:
        f()
        n += 1
    return elapsed / n


def dense_linear(w: torch.Tensor) -> Linear:
    """minisgl's dense layer, its weight packed for oneDNN as the loader packs it."""
    module = Linear(w.shape[1], w.shape[0])
    module.weight = torch.nn.Parameter(w, requires_grad=False)
    pack_weights(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 24, 32, 64, 128, 512])
    parser.add_argument("--sizes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--kernels", default="auto", choices=KERNEL_CHOICES, help="EngineConfig.kernels: c:avx2 forces that build"
    )
    args = parser.parse_args()
    retain_freed_memory()  # as the engine does: a large output's fresh pages would fault on every call
    if args.threads:
        torch.set_num_threads(args.threads)
    kernels = resolve_kernels(args.kernels)
    flags = cpu_flags()
    print(f"# machine: {machine_info(torch.get_num_threads())['cpu']}, {torch.get_num_threads()} threads")
    print(
        f"# code path: C kernels {kernels.variant.description if kernels else 'no (torch fallback)'}; AMX "
        f"{'yes' if 'amx_bf16' in flags else 'no'}; AVX-512 BF16 {'yes' if 'avx512_bf16' in flags else 'no'}"
    )
    print(f"# load average at start: {load_average()}")
    print(
        "| size | weight | format | rows | C kernel ms | C kernel, two digits ms | C kernel, prefill rows ms "
        "| torch kernel ms | bf16 expansion ms | dense bf16 ms | dense fp32 ms | torch faster |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    torch.manual_seed(0)
    with torch.inference_mode():
        for size in args.sizes:
            for name, n, k in SHAPES[size]:
                w = torch.randn(n, k) * 0.02
                quantized: list[tuple[str, QuantizedWeight]] = [("int4", Int4Weight.quantize(w))]
                if name == "lm_head":
                    quantized.append(("int8", Int8Weight.quantize(w)))
                bf16, fp32 = dense_linear(w.bfloat16()), dense_linear(w.clone())
                for fmt, q in quantized:
                    q.buffer = DequantBuffer(min(n * k, DEQUANT_BUFFER_ELEMENTS))
                    c_matmul = q.bind(kernels, 1) if kernels is not None else None
                    c_two_digits = q.bind(kernels, 2) if kernels is not None else None
                    for rows in args.rows:
                        x = torch.randn(rows, k)
                        xb = x.bfloat16()
                        t_c = seconds(partial(c_matmul, x)) if c_matmul is not None else float("nan")
                        t_two = seconds(partial(c_two_digits, x)) if c_two_digits is not None else float("nan")
                        prefill = c_matmul is not None and kernels is not None and kernels.bf16_prefill
                        t_prefill = seconds(partial(c_matmul, x, rows)) if prefill else float("nan")
                        t_kernel = seconds(partial(q.kernel, x))
                        t_many = seconds(partial(q.many_rows, x))
                        t_bf16 = seconds(partial(bf16, xb))
                        t_fp32 = seconds(partial(fp32, x))
                        faster = "kernel" if t_kernel < t_many else "expansion"
                        print(
                            f"| {size} | {name} | {fmt} | {rows} | {t_c * 1e3:.2f} | {t_two * 1e3:.2f} | "
                            f"{t_prefill * 1e3:.2f} | {t_kernel * 1e3:.2f} | {t_many * 1e3:.2f} | {t_bf16 * 1e3:.2f} | "
                            f"{t_fp32 * 1e3:.2f} | {faster} |",
                            flush=True,
                        )
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
