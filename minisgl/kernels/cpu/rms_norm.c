// RMSNorm of fp32 rows, optionally after adding a residual: one call where torch's composite
// runs seven ops (through the module at one row, 17 us against 7 us here; a decode step runs 61 norms).
//
// With `delta` non-null: sum = x + delta is written to `sum_out`, then normalised. The arithmetic
// is Hugging Face's order: x * (1 / sqrt(mean(x^2) + eps)), times the weight. The squares are summed
// in WIDTH lanes (two chains of them) where the build has vectors: one chain of scalar adds is
// bound by its latency, about four cycles a value.

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

// Sum of squares of row (after writing row + delta to sum where delta is non-null); the row read is
// `sum` then.
static float squares_of(const float *row, const float *delta, float *sum, int64_t n) {
    int64_t i = 0;
    float squares = 0.0f;
#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)
    VecF even = vec_zero(), odd = vec_zero();
    for (; i + 2 * WIDTH <= n; i += 2 * WIDTH) {
        VecF a = vec_load(row + i), b = vec_load(row + i + WIDTH);
        if (delta != 0) {
            a = vec_add(a, vec_load(delta + i));
            b = vec_add(b, vec_load(delta + i + WIDTH));
            vec_store(sum + i, a);
            vec_store(sum + i + WIDTH, b);
        }
        even = vec_fmadd(a, a, even);
        odd = vec_fmadd(b, b, odd);
    }
    squares = vec_reduce_add(vec_add(even, odd));
#endif
    for (; i < n; i++) {
        const float v = delta != 0 ? (sum[i] = row[i] + delta[i]) : row[i];
        squares += v * v;
    }
    return squares;
}

// rms_norm's arguments but its output.
typedef struct {
    const float *x, *delta;
    float *sum_out;
    const float *weight;
    int64_t n;
    float eps;
} Norm;

// Row r normalised into `to` (and its sum with delta written to sum_out's row r where delta is non-null).
static void norm_row(const void *context, int64_t r, float *to) {
    const Norm *a = context;
    const int64_t n = a->n;
    float *sr = a->delta != 0 ? a->sum_out + r * n : 0;
    const float squares = squares_of(a->x + r * n, a->delta != 0 ? a->delta + r * n : 0, sr, n);
    const float *xr = sr != 0 ? sr : a->x + r * n;
    const float inverse = 1.0f / sqrtf(squares / (float)n + a->eps);
    const float *weight = a->weight;
    int64_t i = 0;
#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)
    const VecF scale = vec_set1(inverse);
    for (; i + WIDTH <= n; i += WIDTH)
        vec_store(to + i, vec_mul(vec_load(weight + i), vec_mul(vec_load(xr + i), scale)));
#endif
    for (; i < n; i++) to[i] = weight[i] * (xr[i] * inverse);
}

void rms_norm(const float *x, const float *delta, float *sum_out, const float *weight, int64_t rows, int64_t n,
              float eps, float *out, int threads) {
    const Norm norm = {x, delta, sum_out, weight, n, eps};
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 16)
    for (int64_t r = 0; r < rows; r++) norm_row(&norm, r, out + r * n);
}

// rms_norm's rows rounded as the products round their rows (round_rows_of), each normalised into a thread's
// buffer and rounded from there: the product that takes them reads them once, a quarter of their fp32 bytes,
// and no fp32 copy goes out to memory.
int rms_norm_rounded(const float *x, const float *delta, float *sum_out, const float *weight, int64_t rows,
                     int64_t n, float eps, int8_t *codes, float *step, int32_t *total, float *sum, int threads) {
    const Norm norm = {x, delta, sum_out, weight, n, eps};
    return round_rows_of(norm_row, &norm, rows, n, codes, step, total, sum, threads);
}
