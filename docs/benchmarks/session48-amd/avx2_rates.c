// Session 48: how many of the AVX2 int4 product's instructions a Zen 3 core issues a cycle, each alone and
// in pairs (12 independent chains, so latency does not bound them). The clock is estimated from a chain of
// dependent integer adds (one a cycle).
//     cc -O2 docs/benchmarks/session48-amd/avx2_rates.c -o /tmp/avx2_rates && /tmp/avx2_rates
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define R12(op)                                                                                                  \
    op " %%ymm15, %%ymm0, %%ymm0\n\t" op " %%ymm15, %%ymm1, %%ymm1\n\t" op " %%ymm15, %%ymm2, %%ymm2\n\t" op       \
       " %%ymm15, %%ymm3, %%ymm3\n\t" op " %%ymm15, %%ymm4, %%ymm4\n\t" op " %%ymm15, %%ymm5, %%ymm5\n\t" op      \
       " %%ymm15, %%ymm6, %%ymm6\n\t" op " %%ymm15, %%ymm7, %%ymm7\n\t" op " %%ymm15, %%ymm8, %%ymm8\n\t" op      \
       " %%ymm15, %%ymm9, %%ymm9\n\t" op " %%ymm15, %%ymm10, %%ymm10\n\t" op " %%ymm15, %%ymm11, %%ymm11\n\t"
#define B12                                                                                                    \
    "vpbroadcastd (%0), %%ymm0\n\tvpbroadcastd 4(%0), %%ymm1\n\tvpbroadcastd 8(%0), %%ymm2\n\t"                \
    "vpbroadcastd 12(%0), %%ymm3\n\tvpbroadcastd 16(%0), %%ymm4\n\tvpbroadcastd 20(%0), %%ymm5\n\t"            \
    "vpbroadcastd 24(%0), %%ymm6\n\tvpbroadcastd 28(%0), %%ymm7\n\tvpbroadcastd 32(%0), %%ymm8\n\t"            \
    "vpbroadcastd 36(%0), %%ymm9\n\tvpbroadcastd 40(%0), %%ymm10\n\tvpbroadcastd 44(%0), %%ymm11\n\t"
#define CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11"
#define N 50000000L

// Issues `body` (`per_iteration` instructions) N times and prints how many a cycle at `ghz`.
#define RATE(what, per_iteration, body)                                                   \
    do {                                                                                  \
        const double start = now();                                                       \
        for (long i = 0; i < N; i++) body;                                                \
        printf("%-40s %.2f a cycle\n", what, per_iteration * N / (now() - start) / 1e9 / ghz); \
    } while (0)

int main(void) {
    static int buffer[64] __attribute__((aligned(64)));
    long x = 0;
    double t = now();
    for (long i = 0; i < 4 * N; i++) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    const double ghz = 16.0 * N / (now() - t) / 1e9;
    printf("clock, from dependent adds: %.2f GHz\n", ghz);
    RATE("vpmaddubsw", 12, __asm__ volatile(R12("vpmaddubsw")::: CLOBBERS));
    RATE("vpmaddwd", 12, __asm__ volatile(R12("vpmaddwd")::: CLOBBERS));
    RATE("vpaddw", 12, __asm__ volatile(R12("vpaddw")::: CLOBBERS));
    RATE("vfmadd231ps", 12, __asm__ volatile(R12("vfmadd231ps")::: CLOBBERS));
    RATE("vpmaddubsw + vfmadd231ps, 1:1", 24, __asm__ volatile(R12("vpmaddubsw") R12("vfmadd231ps")::: CLOBBERS));
    RATE("vpmaddubsw + vpaddw, 1:1", 24, __asm__ volatile(R12("vpmaddubsw") R12("vpaddw")::: CLOBBERS));
    RATE("vpbroadcastd from memory", 12, __asm__ volatile(B12::"r"(buffer) : CLOBBERS));
    RATE("vpbroadcastd + vpmaddubsw, 1:1", 24, __asm__ volatile(B12 R12("vpmaddubsw")::"r"(buffer) : CLOBBERS));
    return 0;
}
