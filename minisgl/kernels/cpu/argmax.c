// The greedy sampler's argmax over each row of fp32 logits (Sampler through CpuKernels.argmax): the index of
// the row's largest value, the first of equal ones, or of its first NaN where it has one: torch.max's indices,
// which the sampler took before, from a kernel that compares a value at a time. Here a row is two vector
// passes: its largest value (and whether any lane is a NaN), then the first lane that equals it.

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

static int64_t argmax_row_ref(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) return i;
        if (x[i] > x[best]) best = i;
    }
    return best;
}

int argmax_rows_ref(const float *x, int64_t rows, int64_t n, int64_t *out) {
    if (n < 1) return KERNELS_BAD_SHAPE;
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row_ref(x + r * n, n);
    return KERNELS_OK;
}

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)
static int64_t argmax_row(const float *x, int64_t n) {
    const int64_t whole = n / WIDTH * WIDTH;
    VecF top = vec_set1(-INFINITY);
    unsigned nans = 0;
    for (int64_t i = 0; i < whole; i += WIDTH) {
        const VecF v = vec_load(x + i);
        nans |= vec_nan_bits(v);
        top = vec_max(v, top);  // a NaN lane keeps the running maximum (max's second operand)
    }
    float best = whole ? vec_reduce_max(top) : -INFINITY;
    for (int64_t i = whole; i < n; i++) {
        nans |= isnan(x[i]);
        best = x[i] > best ? x[i] : best;
    }
    if (nans) return argmax_row_ref(x, n);  // its first NaN
    const VecF target = vec_set1(best);
    for (int64_t i = 0; i < whole; i += WIDTH) {
        const unsigned equal = vec_equal_bits(vec_load(x + i), target);
        if (equal) return i + __builtin_ctz(equal);
    }
    for (int64_t i = whole; i < n; i++)
        if (x[i] == best) return i;
    return 0;  // not reached: the largest value is one of the row's
}
#else
#define argmax_row argmax_row_ref
#endif

int argmax_rows(const float *x, int64_t rows, int64_t n, int64_t *out, int threads) {
    if (n < 1) return KERNELS_BAD_SHAPE;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * n, n);
    return KERNELS_OK;
}
