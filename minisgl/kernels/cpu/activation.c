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

static void silu_mul_row(const float *gate_up, int64_t r, int64_t n, float *to) {
    const float *gate = gate_up + r * 2 * n, *up = gate + n;
    int64_t i = 0;
#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)
    for (; i + WIDTH <= n; i += WIDTH) vec_store(to + i, vec_silu_mul(vec_load(gate + i), vec_load(up + i)));
#endif
    for (; i < n; i++) to[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void silu_mul(const float *gate_up, int64_t rows, int64_t n, float *act, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 16)
    for (int64_t r = 0; r < rows; r++) silu_mul_row(gate_up, r, n, act + r * n);
}

// silu_mul's rows rounded as the products round their rows, as rms_norm_rounded rounds its own.
int silu_mul_rounded(const float *gate_up, int64_t rows, int64_t n, int8_t *codes, float *step, int32_t *total,
                     float *sum, int threads) {
    if (n % GROUP) return KERNELS_BAD_SHAPE;
    const int64_t groups = n / GROUP;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (rows > 1)
    {
        static _Thread_local Scratch scratch;
        float *row = scratch_reserve(&scratch, sizeof(float) * (size_t)n);
        if (row == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (row == NULL) continue;
            silu_mul_row(gate_up, r, n, row);
            round_row_one_digit(row, n, codes + r * n, step + r * groups, total + r * groups, sum + r * groups);
        }
    }
    return failed ? KERNELS_NO_MEMORY : KERNELS_OK;
}
