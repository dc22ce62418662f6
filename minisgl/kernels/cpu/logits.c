// The sampler's kernels over rows of fp32 logits, each row in vector passes (reading the row, writing
// nothing of its size):
// - argmax (the greedy tokens, CpuKernels.argmax): the index of the row's largest value, the first of equal
//   ones, or of its first NaN where it has one: torch.max's indices, which the sampler took before, from a
//   kernel that compares a value at a time. Its largest value, then the first lane that equals it.
// - log-sum-exp (log-probabilities, CpuKernels.logsumexp: a token's is its logit less its row's),
//   log sum_i e^x_i: the row's largest value m plus the log of sum_i e^(x_i - m), where torch's log_softmax
//   writes a row of log-probabilities out. NaN for a row with a NaN; the largest value where it is infinite.

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
// The row's largest value (-inf for none), and in *nan whether it has a NaN (which max passes over: a NaN
// lane keeps the running maximum, max's second operand).
static float row_max(const float *x, int64_t n, int *nan) {
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
    *nan = nans != 0;
    return m;
}

static int64_t argmax_row(const float *x, int64_t n) {
    int nan;
    const float best = row_max(x, n, &nan);
    if (nan) return argmax_row_ref(x, n);  // its first NaN
    const int64_t whole = n / WIDTH * WIDTH;
    const VecF target = vec_set1(best);
    for (int64_t i = 0; i < whole; i += WIDTH) {
        const unsigned equal = vec_equal_bits(vec_load(x + i), target);
        if (equal) return i + __builtin_ctz(equal);
    }
    for (int64_t i = whole; i < n; i++)
        if (x[i] == best) return i;
    return 0;  // not reached: the largest value is one of the row's
}

static float logsumexp_row(const float *x, int64_t n) {
    int nan;
    const float m = row_max(x, n, &nan);
    if (nan) return NAN;
    if (isinf(m)) return m;
    // Two sums, each half as long a chain of adds: the exponentials' latency, not their count, bounds one.
    const int64_t whole = n / WIDTH * WIDTH;
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
#define argmax_row argmax_row_ref
#define logsumexp_row logsumexp_row_ref
#endif

int argmax_rows(const float *x, int64_t rows, int64_t n, int64_t *out, int threads) {
    if (n < 1) return KERNELS_BAD_SHAPE;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * n, n);
    return KERNELS_OK;
}

int logsumexp_rows(const float *x, int64_t rows, int64_t n, float *out, int threads) {
    if (n < 1) return KERNELS_BAD_SHAPE;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) out[r] = logsumexp_row(x + r * n, n);
    return KERNELS_OK;
}
