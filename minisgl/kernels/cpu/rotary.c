// Rotate-half RoPE of fp32 heads, for decode_layer.c: x * cos + rotate_half(x) * sin as
// minisgl/layers/rotary.py computes it, each product and the sum rounded on its own (the source is
// built in ISO C mode, which does not contract them into fused multiply-adds).
//
// Also the prefill's (CpuKernels.rotary): one pass over Q and K where torch's ops make three
// temporaries of them.
//
// x: [tokens, heads, d] with `stride` floats between tokens (a view into the fused QKV output);
// cos, sin: [tokens, d], sin with its first half negated; out: [tokens, heads, d] contiguous.

#include <stdint.h>

#include "kernels.h"
#include "simd.h"

void rotary(const float *x, int64_t stride, int64_t tokens, int64_t heads, int64_t d, const float *cos,
            const float *sin, float *out, int threads) {
    const int64_t half = d / 2;
#pragma omp parallel for num_threads(threads) schedule(static) if (tokens > 16)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + t * d, *s = sin + t * d;
        for (int64_t h = 0; h < heads; h++) {
            const float *xh = x + t * stride + h * d;
            float *oh = out + (t * heads + h) * d;
            int64_t i = 0;
#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)
            for (; i + WIDTH <= half; i += WIDTH) {  // the same products and sums a vector at a time
                const VecF first = vec_load(xh + i), second = vec_load(xh + i + half);
                vec_store(oh + i, vec_add(vec_mul(first, vec_load(c + i)), vec_mul(second, vec_load(s + i))));
                vec_store(oh + i + half,
                          vec_add(vec_mul(second, vec_load(c + i + half)), vec_mul(first, vec_load(s + i + half))));
            }
#endif
            for (; i < half; i++) {
                oh[i] = xh[i] * c[i] + xh[i + half] * s[i];
                oh[i + half] = xh[i + half] * c[i + half] + xh[i] * s[i + half];
            }
        }
    }
}
