// The log-sum-exp of each row of fp32 logits, log sum_i e^x_i (Sampler's log-probabilities through
// CpuKernels.logsumexp: a token's is its logit minus its row's): the row's largest value m plus the log of
// sum_i e^(x_i - m), in two vector passes, without writing a row of log-probabilities out as torch's
// log_softmax does. A row with a NaN gives NaN; one whose largest value is infinite gives it.

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

static float logsumexp_row_ref(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) return NAN;
        m = x[i] > m ? x[i] : m;
    }
    if (isinf(m)) return m;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)x[i] - (double)m);
    return (float)((double)m + log(sum));
}

int logsumexp_rows_ref(const float *x, int64_t rows, int64_t n, float *out) {
    if (n < 1) return KERNELS_BAD_SHAPE;
    for (int64_t r = 0; r < rows; r++) out[r] = logsumexp_row_ref(x + r * n, n);
    return KERNELS_OK;
}

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)
static float logsumexp_row(const float *x, int64_t n) {
    const int64_t whole = n / WIDTH * WIDTH;
    VecF top = vec_set1(-INFINITY);
    unsigned nans = 0;
    for (int64_t i = 0; i < whole; i += WIDTH) {
        const VecF v = vec_load(x + i);
        nans |= vec_nan_bits(v);
        top = vec_max(v, top);
    }
    float m = whole ? vec_reduce_max(top) : -INFINITY;
    for (int64_t i = whole; i < n; i++) {
        nans |= isnan(x[i]);
        m = x[i] > m ? x[i] : m;
    }
    if (nans) return NAN;
    if (isinf(m)) return m;
    // Two sums, each half as long a chain of adds: the exponentials' latency, not their count, bounds one.
    const VecF shift = vec_set1(m);
    VecF even = vec_zero(), odd = vec_zero();
    int64_t i = 0;
    for (; i + 2 * WIDTH <= whole; i += 2 * WIDTH) {
        even = vec_add(even, vec_exp(vec_sub(vec_load(x + i), shift)));
        odd = vec_add(odd, vec_exp(vec_sub(vec_load(x + i + WIDTH), shift)));
    }
    if (i < whole) even = vec_add(even, vec_exp(vec_sub(vec_load(x + i), shift)));
    float sum = vec_reduce_add(vec_add(even, odd));
    for (i = whole; i < n; i++) sum += expf(x[i] - m);
    return m + logf(sum);
}
#else
#define logsumexp_row logsumexp_row_ref
#endif

int logsumexp_rows(const float *x, int64_t rows, int64_t n, float *out, int threads) {
    if (n < 1) return KERNELS_BAD_SHAPE;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) out[r] = logsumexp_row(x + r * n, n);
    return KERNELS_OK;
}
