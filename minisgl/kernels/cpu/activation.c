// SwiGLU's activation of fp32 rows for the quantized layers, in the fused decode step and in the
// layer-by-layer passes alike (CpuKernels.silu_and_mul): one pass where torch's makes a temporary.
// Its exponential (simd.h's vec_exp) is not torch's to the last bit, so dense fp32 layers keep
// torch's, whose outputs match transformers' token for token.
//
// act [rows, n] = silu(gate) * up, where gate_up [rows, 2n] holds each row's gate and then its up.

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

// silu_mul's input and width.
typedef struct {
    const float *gate_up;
    int64_t n;
} Swiglu;

static void silu_mul_row(const void *context, int64_t r, float *to) {
    const Swiglu *a = context;
    const int64_t n = a->n;
    const float *gate = a->gate_up + r * 2 * n, *up = gate + n;
    int64_t i = 0;
#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)
    for (; i + WIDTH <= n; i += WIDTH) vec_store(to + i, vec_silu_mul(vec_load(gate + i), vec_load(up + i)));
#endif
    for (; i < n; i++) to[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void silu_mul(const float *gate_up, int64_t rows, int64_t n, float *act, int threads) {
    const Swiglu swiglu = {gate_up, n};
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 16)
    for (int64_t r = 0; r < rows; r++) silu_mul_row(&swiglu, r, act + r * n);
}

// silu_mul's rows rounded as the products round their rows, as rms_norm_rounded rounds its own.
int silu_mul_rounded(const float *gate_up, int64_t rows, int64_t n, int8_t *codes, float *step, int32_t *total,
                     float *sum, int threads) {
    const Swiglu swiglu = {gate_up, n};
    return round_rows_of(silu_mul_row, &swiglu, rows, n, codes, step, total, sum, threads);
}
