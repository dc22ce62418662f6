// Rotate-half RoPE of fp32 heads in one call (torch's roll, two products and a sum are four ops
// and two temporaries per call, twice a layer). The products and the sum are rounded one by one,
// as torch's are: the source is built without contraction into fused multiply-adds (ISO C mode).
//
// x: [tokens, heads, d] with `stride` floats between tokens (a view into the fused QKV output);
// cos, sin: [tokens, d], sin with its first half negated; out: [tokens, heads, d] contiguous.

#include <stdint.h>

#include "kernels.h"

void rotary(const float *x, int64_t stride, int64_t tokens, int64_t heads, int64_t d, const float *cos,
            const float *sin, float *out) {
    const int64_t half = d / 2;
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + t * d, *s = sin + t * d;
        for (int64_t h = 0; h < heads; h++) {
            const float *xh = x + t * stride + h * d;
            float *oh = out + (t * heads + h) * d;
            for (int64_t i = 0; i < half; i++) {
                oh[i] = xh[i] * c[i] + xh[i + half] * s[i];
                oh[i + half] = xh[i + half] * c[i + half] + xh[i] * s[i + half];
            }
        }
    }
}
