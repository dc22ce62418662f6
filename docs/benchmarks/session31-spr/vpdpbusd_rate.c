// Session 31: vpdpbusd's rate on one core of this VM (notes.md, "Tried and not kept"): 20 independent chains
// of zmm vpdpbusd, so that its throughput, not its latency, bounds the loop; billions of instructions a second.
//
//   cc -O2 -mavx512f -mavx512vnni vpdpbusd_rate.c -o /tmp/vpdpbusd_rate && /tmp/vpdpbusd_rate
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define DOT(j) __asm__ volatile("vpdpbusd %1, %2, %0" : "+v"(acc[j]) : "v"(u), "v"(w));

int main(void) {
    __m512i acc[20];
    for (int i = 0; i < 20; i++) acc[i] = _mm512_set1_epi32(i);
    const __m512i u = _mm512_set1_epi32(3), w = _mm512_set1_epi32(5);
    for (int run = 0; run < 3; run++) {
        const long n = 20000000;
        const double start = now();
        for (long i = 0; i < n; i++) {
            DOT(0) DOT(1) DOT(2) DOT(3) DOT(4) DOT(5) DOT(6) DOT(7) DOT(8) DOT(9)
            DOT(10) DOT(11) DOT(12) DOT(13) DOT(14) DOT(15) DOT(16) DOT(17) DOT(18) DOT(19)
        }
        printf("vpdpbusd zmm: %.2f G a second\n", 20.0 * (double)n / (now() - start) / 1e9);
    }
    return 0;
}
