"""Session 37: what one core of this machine computes per second on its vector units and on its tile unit,
the ceilings the notes' per-kernel figures are read against.

- fp32 FMAs, 512-bit and 256-bit: 16 independent chains of vfmadd231ps in registers, on 1 thread and on 2;
- AMX-BF16 (where the CPU has it): the kernels' own tile configuration (``simd.h``'s ``tiles_configure``), then
  tdpbf16ps into 4 sum tiles from 4 tiles loaded once (16 x 16 x 32 products
  each), on 1 thread and on 2.

Compiled with the compiler the kernels are built with (``minisgl.kernels.native.c_compiler``), -O2; the
tile program with the amx build's flags.

    PYTHONPATH=. python docs/benchmarks/session37-spr/ceilings.py
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from benchmarks.machine import load_average, machine_info
from minisgl.kernels.native import SOURCE_DIR, c_compiler
from minisgl.kernels.variants import VARIANTS, cpu_flags

FMA = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
    const long steps = 100000000L;
    for (int threads = 1; threads <= 2; threads++) {
        float sink = 0.0f;
        const double start = now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
            VEC acc[16];
            for (int i = 0; i < 16; i++) acc[i] = SET1(1.0f + i * 1e-7f);
            const VEC b = SET1(0.9999999f), c = SET1(1e-7f);
            for (long n = 0; n < steps; n++)
                for (int i = 0; i < 16; i++) acc[i] = FMADD(acc[i], b, c);
            for (int i = 0; i < 16; i++) sink += acc[i][0];
        }
        const double seconds = now() - start;
        printf("%s fp32 FMA, %d thread(s): %.1f GFLOP/s (%.2f G instructions/s per thread)%s\n", NAME, threads,
               2.0 * threads * steps * 16 * LANES / seconds / 1e9, steps * 16 / seconds / 1e9, sink == 0.0f ? " " : "");
    }
    return 0;
}
"""

TILES = r"""
#define _GNU_SOURCE
#include <omp.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "simd.h"  // the kernels' tiles_configure
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) return 1;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    const long steps = 20000000L;
    for (int threads = 1; threads <= 2; threads++) {
        const double start = now();
#pragma omp parallel num_threads(threads)
        {
            tiles_configure();
            static uint16_t a[2][16 * 32] __attribute__((aligned(64)));
            _tile_loadd(4, a[0], 64); _tile_loadd(5, a[1], 64); _tile_loadd(6, a[0], 64); _tile_loadd(7, a[1], 64);
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (long n = 0; n < steps; n++) {
                _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
            }
            _tile_release();
        }
        const double seconds = now() - start;
        printf("AMX-BF16 tdpbf16ps, %d thread(s): %.0f GFLOP/s (%.1f ns a product per thread)\n", threads,
               2.0 * threads * steps * 4 * 16 * 16 * 32 / seconds / 1e9, seconds / (steps * 4) * 1e9);
    }
    return 0;
}
"""

# name: (compiler flags, register type, intrinsics' prefix, fp32 lanes)
REGISTERS = {"512-bit": ("-mavx512f", "__m512", "_mm512", 16), "256-bit": ("-mavx2 -mfma", "__m256", "_mm256", 8)}


def fma_source(name: str, vec: str, prefix: str, lanes: int) -> str:
    return (
        f"#define VEC {vec}\n#define SET1 {prefix}_set1_ps\n#define FMADD {prefix}_fmadd_ps\n"
        f'#define LANES {lanes}\n#define NAME "{name}"\n{FMA}'
    )


def run(source: str, flags: str, directory: Path, name: str) -> str:
    compiler = c_compiler()
    if compiler is None:
        raise SystemExit("no C compiler")
    c_file, binary = directory / f"{name}.c", directory / name
    c_file.write_text(source)
    subprocess.run([compiler, "-O2", *flags.split(), "-fopenmp", "-o", str(binary), str(c_file)], check=True)
    return subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    print(f"# {machine_info(2)}")
    flags = cpu_flags()
    print(f"# AMX: {' '.join(sorted(f for f in flags if f.startswith('amx'))) or 'none'}")
    print(f"# load average at start: {load_average()}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (options, vec, prefix, lanes) in REGISTERS.items():
            if name == "512-bit" and "avx512f" not in flags:
                continue
            print(run(fma_source(name, vec, prefix, lanes), options, Path(tmp), f"fma{lanes}"))
        if "amx_bf16" in flags:
            amx = " ".join(next(v for v in VARIANTS if v.name == "amx").compile_flags)
            print(run(TILES, f"{amx} -I{SOURCE_DIR}", Path(tmp), "tiles"))
        else:
            print("no AMX-BF16 on this CPU")
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
