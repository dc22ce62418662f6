// Session 30: what AMX-BF16's tile loop gives on one core of this VM, by where its operands come from (the
// scratch microbenchmarks behind notes.md, "Tried and not kept"). Each pass runs 4 tdpbf16ps (a 2 x 2 block of
// 16 x 16 sums) per group of 32 columns, as bf16_gemm.c's loop does.
//
//   cc -O2 -mavx512f -mamx-tile -mamx-bf16 amx_tile_loops.c -o /tmp/amx_tile_loops
//   /tmp/amx_tile_loops registers|l1|rows ROWS STEP|overlap FMAS [zeros]
//
// registers: the operands stay in the tile registers; l1: 4 tile loads a group from 16 KB; rows: bf16_gemm.c's
// loop over ROWS rows of x (ROWS x 4 KB, from L2 or beyond) against a pair's STEP groups (in L1), the sums
// through a buffer between steps; overlap: 4 tdpbf16ps and FMAS independent AVX-512 fmas an iteration (ns an
// iteration). The data are random bf16 values unless `zeros` is given.
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { GROUPS = 64 };

// The four products of a 2 x 2 block: sums 0-3, x in 4-5, the weight in 6-7.
#define PRODUCTS()                 \
    do {                           \
        _tile_dpbf16ps(0, 4, 6);   \
        _tile_dpbf16ps(1, 4, 7);   \
        _tile_dpbf16ps(2, 5, 6);   \
        _tile_dpbf16ps(3, 5, 7);   \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint16_t *bf16_buffer(size_t values, int zeros) {
    uint16_t *b = aligned_alloc(4096, (values * 2 + 4095) / 4096 * 4096);
    for (size_t i = 0; i < values; i++)
        b[i] = zeros ? 0 : (uint16_t)(0x3f80 + (rand() & 0x7f) - ((rand() & 1) << 15));  // +-1 .. 2
    return b;
}

int main(int argc, char **argv) {
    if (argc < 2 || syscall(SYS_arch_prctl, 0x1023, 18) != 0) return 2;
    struct __attribute__((aligned(64))) {
        uint8_t palette, start, reserved[14];
        uint16_t columns[16];
        uint8_t rows[16];
    } c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.columns[t] = 64;
    _tile_loadconfig(&c);
    const int zeros = !strcmp(argv[argc - 1], "zeros");
    const double flops_per_dp = 2.0 * 16 * 16 * 32;
    if (!strcmp(argv[1], "registers") || !strcmp(argv[1], "l1")) {
        uint16_t *buf = bf16_buffer(8192, zeros);  // 16 KB
        const int loads = !strcmp(argv[1], "l1");
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        _tile_loadd(4, buf, 64);
        _tile_loadd(5, buf + 512, 64);
        _tile_loadd(6, buf + 1024, 64);
        _tile_loadd(7, buf + 1536, 64);
        const long n = 5000000;
        const double start = now();
        for (long i = 0, at = 0; i < n; i++, at = (at + 2048) % 8192) {
            if (loads) {
                _tile_loadd(4, buf + at, 64); _tile_loadd(5, buf + at + 512, 64);
                _tile_loadd(6, buf + at + 1024, 64); _tile_loadd(7, buf + at + 1536, 64);
            }
            PRODUCTS();
        }
        const double seconds = now() - start;
        printf("%s%s: %.0f GFLOP/s\n", argv[1], zeros ? " (zeros)" : "", 4 * n * flops_per_dp / seconds / 1e9);
    } else if (!strcmp(argv[1], "rows") && argc >= 4) {
        const int rows = atoi(argv[2]), step = atoi(argv[3]), pairs = 65536 / rows;
        uint16_t *x = bf16_buffer((size_t)rows * GROUPS * 32, zeros), *w = bf16_buffer((size_t)GROUPS * 1024, zeros);
        float *sums = aligned_alloc(4096, (size_t)rows * 32 * 4);
        const double start = now();
        for (int p = 0; p < pairs; p++)
            for (int g0 = 0; g0 < GROUPS; g0 += step)
                for (int r0 = 0; r0 < rows; r0 += 32) {
                    float *held = sums + r0 * 32;
                    if (g0 == 0) {
                        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                    } else {
                        _tile_loadd(0, held, 128); _tile_loadd(1, held + 16, 128);
                        _tile_loadd(2, held + 512, 128); _tile_loadd(3, held + 528, 128);
                    }
                    const uint16_t *x0 = x + (size_t)r0 * GROUPS * 32, *x1 = x0 + 16 * GROUPS * 32;
                    for (int g = g0; g < g0 + step; g++) {
                        _tile_loadd(4, x0 + g * 512, 64); _tile_loadd(5, x1 + g * 512, 64);
                        _tile_loadd(6, w + (g - g0) * 1024, 64); _tile_loadd(7, w + (g - g0) * 1024 + 512, 64);
                        PRODUCTS();
                    }
                    _tile_stored(0, held, 128); _tile_stored(1, held + 16, 128);
                    _tile_stored(2, held + 512, 128); _tile_stored(3, held + 528, 128);
                }
        const double dps = 4.0 * pairs * (rows / 32) * GROUPS;
        printf("rows %d, step %d%s: %.0f GFLOP/s\n", rows, step, zeros ? " (zeros)" : "",
               dps * flops_per_dp / (now() - start) / 1e9);
    } else if (!strcmp(argv[1], "overlap") && argc >= 3) {
        const int fmas = atoi(argv[2]) / 8;
        uint16_t *buf = bf16_buffer(2048, zeros);
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        _tile_loadd(4, buf, 64);
        _tile_loadd(5, buf + 512, 64);
        _tile_loadd(6, buf + 1024, 64);
        _tile_loadd(7, buf + 1536, 64);
        // Eight independent chains in eight named registers: the fmas at the units' full rate.
        __m512 a0 = _mm512_set1_ps(1.0001f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        const __m512 m = _mm512_set1_ps(0.9999f);
        const long n = 2000000;
        double times[3];
        for (int mode = 1; mode <= 3; mode++) {  // tiles, fmas, both
            const double start = now();
            for (long i = 0; i < n; i++) {
                if (mode & 1) PRODUCTS();
                if (mode & 2)
                    for (int j = 0; j < fmas; j++) {
                        a0 = _mm512_fmadd_ps(a0, m, m), a1 = _mm512_fmadd_ps(a1, m, m), a2 = _mm512_fmadd_ps(a2, m, m);
                        a3 = _mm512_fmadd_ps(a3, m, m), a4 = _mm512_fmadd_ps(a4, m, m), a5 = _mm512_fmadd_ps(a5, m, m);
                        a6 = _mm512_fmadd_ps(a6, m, m), a7 = _mm512_fmadd_ps(a7, m, m);
                    }
                __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3));  // keep the chains
                __asm__ volatile("" : "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7));
            }
            times[mode - 1] = (now() - start) / n * 1e9;
        }
        printf("4 tdpbf16ps alone %.1f ns, %d fmas alone %.1f ns, both %.1f ns an iteration\n", times[0], 8 * fmas,
               times[1], times[2]);
    } else {
        return 2;
    }
    return 0;
}
