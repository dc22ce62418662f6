// Session 31: a prototype of decode rows' int4 products on AMX-INT8, 16 rows of x at a time (the scratch
// microbenchmark behind notes.md, "Tried and not kept"). Per tile of 16 outputs and group of 32 columns: the
// codes unpacked to bytes in the tile layout (the Int4 tiles' vectors are already 16 outputs x 4 columns), one
// tdpbsud (x's int8 digits by the codes), the 16 x 16 int32 sums stored, then quant_gemm.c's chain of fmas per
// output: acc = fma(sum, scale x step, acc); acc = fma(minimum, x's group sum, acc). The outputs are checked
// bit for bit against a scalar loop of that arithmetic. Two threads split the tiles, as the engine's do.
//
//   cc -O3 -march=sapphirerapids -fopenmp amx_int8_decode.c -o /tmp/amx_int8_decode -lm
//   /tmp/amx_int8_decode N K [full|tiles|epilogue|stale-b]
//
// full: as described; tiles: without the fmas; epilogue: the fmas alone (on whatever the sums buffer holds);
// stale-b: the tile products read their codes from a buffer written once, not the one just unpacked into (what
// the store-to-tile-load forwarding costs). Best of 30 calls after one warm-up.
#define _GNU_SOURCE
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { TILE = 16, GROUP = 32, ROWS = 16 };
typedef struct __attribute__((aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t columns[16];
    uint8_t rows[16];
    uint8_t unused[16];
} TileConfig;

static int run_tiles = 1, run_epilogue = 1, stale_b = 0;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// The arithmetic of quant_gemm.c's int4 product with one digit of x, in scalar C.
static void reference(int64_t K, int64_t N, const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum,
                      const int8_t *q, const float *step, const float *sum, float *y) {
    const int64_t groups = K / GROUP;
    for (int r = 0; r < ROWS; r++)
        for (int64_t o = 0; o < N; o++) {
            const int64_t t = o / TILE, lane = o % TILE;
            float acc = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                const uint8_t *group = codes + (t * groups + g) * 256;
                int dot = 0;
                for (int c = 0; c < GROUP; c++) {
                    const uint8_t byte = group[(c % 16) / 4 * 64 + lane * 4 + c % 4];
                    dot += (c < 16 ? byte & 15 : byte >> 4) * q[r * K + g * GROUP + c];
                }
                const int64_t at = (t * groups + g) * TILE + lane;
                acc = fmaf((float)dot, _cvtsh_ss(scale[at]) * step[r * groups + g], acc);
                acc = fmaf(_cvtsh_ss(minimum[at]), sum[r * groups + g], acc);
            }
            y[r * N + o] = acc;
        }
}

static void product(int64_t K, int64_t N, const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum,
                    const int8_t *q, const float *step, const float *sum, float *y) {
    const int64_t groups = K / GROUP, tiles = N / TILE;
#pragma omp parallel num_threads(2)
    {
        TileConfig config;
        memset(&config, 0, sizeof config);
        config.palette = 1;
        for (int t = 0; t < 8; t++) config.rows[t] = 16, config.columns[t] = 64;
        _tile_loadconfig(&config);
        // The codes as tile rows: 8 of the group's 4-column pieces, then 8 zero rows (x's next 32 bytes,
        // which the 64-byte tile rows also read, count for nothing).
        uint8_t b[2][1024] __attribute__((aligned(64))), stale[1024] __attribute__((aligned(64)));
        int32_t sums[2][256] __attribute__((aligned(64)));
        memset(b, 0, sizeof b), memset(stale, 1, sizeof stale), memset(sums, 0, sizeof sums);
        const __m512i nibble = _mm512_set1_epi8(15);
        const int thread = omp_get_thread_num();
        for (int64_t t = tiles * thread / 2; t < tiles * (thread + 1) / 2; t++) {
            __m512 acc[ROWS];
            for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
            for (int64_t g = 0; g <= groups; g++) {  // group g's tile product, then group g - 1's fmas
                const int at = (int)(g & 1);
                if (g < groups && run_tiles) {
                    const uint8_t *group = codes + (t * groups + g) * 256;
                    for (int i = 0; i < 4; i++) {
                        const __m512i v = _mm512_loadu_si512(group + i * 64);
                        _mm512_store_si512(b[at] + i * 64, _mm512_and_si512(v, nibble));
                        _mm512_store_si512(b[at] + (4 + i) * 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
                    }
                    const uint8_t *operand = stale_b ? stale : b[at];
                    if (at == 0) {
                        _tile_loadd(2, operand, 64);
                        _tile_loadd(4, q + g * GROUP, K);
                        _tile_zero(0);
                        _tile_dpbsud(0, 4, 2);
                        _tile_stored(0, sums[0], 64);
                    } else {
                        _tile_loadd(3, operand, 64);
                        _tile_loadd(5, q + g * GROUP, K);
                        _tile_zero(1);
                        _tile_dpbsud(1, 5, 3);
                        _tile_stored(1, sums[1], 64);
                    }
                }
                if (g > 0 && run_epilogue) {
                    const int64_t done = g - 1, w = (t * groups + done) * TILE;
                    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scale + w)));
                    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(minimum + w)));
                    for (int r = 0; r < ROWS; r++) {
                        const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(sums[done & 1] + r * 16));
                        const __m512 times = _mm512_mul_ps(s, _mm512_set1_ps(step[r * groups + done]));
                        acc[r] = _mm512_fmadd_ps(dot, times, acc[r]);
                        acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(sum[r * groups + done]), acc[r]);
                    }
                }
            }
            for (int r = 0; r < ROWS; r++) _mm512_storeu_ps(y + r * N + t * TILE, acc[r]);
        }
        _tile_release();
    }
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const int64_t N = atol(argv[1]), K = atol(argv[2]), groups = K / GROUP, tiles = N / TILE;
    const char *mode = argc > 3 ? argv[3] : "full";
    run_tiles = strcmp(mode, "epilogue") != 0, run_epilogue = strcmp(mode, "tiles") != 0;
    stale_b = strcmp(mode, "stale-b") == 0;
    if (syscall(SYS_arch_prctl, 0x1023, 18)) {  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
        puts("no tile permission");
        return 1;
    }
    uint8_t *codes = aligned_alloc(64, (size_t)(tiles * groups * 256));
    uint16_t *scale = malloc(sizeof(uint16_t) * (size_t)(tiles * groups * TILE));
    uint16_t *minimum = malloc(sizeof(uint16_t) * (size_t)(tiles * groups * TILE));
    int8_t *q = aligned_alloc(64, (size_t)(ROWS * K + 64));
    float *step = malloc(sizeof(float) * (size_t)(ROWS * groups));
    float *sum = malloc(sizeof(float) * (size_t)(ROWS * groups));
    float *y = malloc(sizeof(float) * (size_t)(ROWS * N)), *expected = malloc(sizeof(float) * (size_t)(ROWS * N));
    srand(1);
    for (int64_t i = 0; i < tiles * groups * 256; i++) codes[i] = (uint8_t)rand();
    for (int64_t i = 0; i < tiles * groups * TILE; i++) {
        scale[i] = _cvtss_sh((float)(rand() % 1000) * 1e-5f, 0);
        minimum[i] = _cvtss_sh(-(float)(rand() % 1000) * 1e-5f, 0);
    }
    for (int64_t i = 0; i < ROWS * K + 64; i++) q[i] = (int8_t)(rand() % 255 - 127);
    for (int64_t i = 0; i < ROWS * groups; i++) {
        step[i] = (float)(rand() % 100 + 1) * 1e-3f;
        sum[i] = (float)(rand() % 100 - 50) * 0.1f;
    }
    if (strcmp(mode, "full") == 0) {
        product(K, N, codes, scale, minimum, q, step, sum, y);
        reference(K, N, codes, scale, minimum, q, step, sum, expected);
        int64_t differ = 0;
        for (int64_t i = 0; i < ROWS * N; i++) differ += memcmp(&y[i], &expected[i], sizeof(float)) != 0;
        printf("outputs unlike the reference's bits: %ld of %ld\n", (long)differ, (long)(ROWS * N));
    }
    product(K, N, codes, scale, minimum, q, step, sum, y);
    double best = 1e9;
    for (int i = 0; i < 30; i++) {
        const double start = now();
        product(K, N, codes, scale, minimum, q, step, sum, y);
        const double took = now() - start;
        best = took < best ? took : best;
    }
    printf("N %ld K %ld, 16 rows, %s: %.3f ms\n", (long)N, (long)K, mode, best * 1e3);
    return 0;
}
