// RMSNorm of fp32 rows, optionally after adding a residual: one call where torch's composite
// runs seven ops (through the module at one row, 17 us against 7 us here; a decode step runs 61 norms).
//
// With `delta` non-null: sum = x + delta is written to `sum_out`, then normalised. The arithmetic
// is Hugging Face's order: x * (1 / sqrt(mean(x^2) + eps)), times the weight.

#include <math.h>
#include <stdint.h>

#include "kernels.h"

void rms_norm(const float *x, const float *delta, float *sum_out, const float *weight, int64_t rows, int64_t n,
              float eps, float *out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 16)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *sr = delta != 0 ? sum_out + r * n : 0;
        float squares = 0.0f;
        if (sr != 0) {
            for (int64_t i = 0; i < n; i++) {
                sr[i] = xr[i] + delta[r * n + i];
                squares += sr[i] * sr[i];
            }
            xr = sr;
        } else {
            for (int64_t i = 0; i < n; i++) squares += xr[i] * xr[i];
        }
        const float inverse = 1.0f / sqrtf(squares / (float)n + eps);
        for (int64_t i = 0; i < n; i++) out[r * n + i] = weight[i] * (xr[i] * inverse);
    }
}
