// Session 32: three instructions' rates on one core of this VM (notes.md): 12 independent chains of each in
// zmm registers, the accumulators never leaving them (session 31's vpdpbusd_rate.c stored every accumulator
// to memory after each instruction, so the store port set its figure), so that throughput, not latency or
// stores, bounds the loop; billions of instructions a second.
//
//   cc -O2 -mavx512f -mavx512bf16 -mavx512vnni instruction_rates.c -o /tmp/instruction_rates && /tmp/instruction_rates
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
#define OPS(op) op " %%zmm30, %%zmm31, %%zmm0\n\t" op " %%zmm30, %%zmm31, %%zmm1\n\t" op " %%zmm30, %%zmm31, %%zmm2\n\t" \
  op " %%zmm30, %%zmm31, %%zmm3\n\t" op " %%zmm30, %%zmm31, %%zmm4\n\t" op " %%zmm30, %%zmm31, %%zmm5\n\t" \
  op " %%zmm30, %%zmm31, %%zmm6\n\t" op " %%zmm30, %%zmm31, %%zmm7\n\t" op " %%zmm30, %%zmm31, %%zmm8\n\t" \
  op " %%zmm30, %%zmm31, %%zmm9\n\t" op " %%zmm30, %%zmm31, %%zmm10\n\t" op " %%zmm30, %%zmm31, %%zmm11\n\t"
#define CLOBBER "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11"
#define RATE(name, op) do { const long n = 50000000; const double t = now(); \
  for (long i = 0; i < n; i++) __asm__ volatile(OPS(op) ::: CLOBBER); \
  printf("%-12s zmm, 12 independent chains: %.2f G a second\n", name, 12.0 * n / (now() - t) / 1e9); } while (0)
int main(void) {
  const float one = 1.0f;  // operands: 1.0 as fp32 lanes; as bf16 pairs and as bytes, small non-zero values
  __asm__ volatile("vbroadcastss %0, %%zmm30\n\tvbroadcastss %0, %%zmm31" :: "m"(one) : "xmm30", "xmm31");
  for (int run = 0; run < 2; run++) {
    RATE("vfmadd231ps", "vfmadd231ps");
    RATE("vdpbf16ps", "vdpbf16ps");
    RATE("vpdpbusd", "vpdpbusd");
  }
  return 0;
}
