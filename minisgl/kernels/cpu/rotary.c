// Rotate-half RoPE of fp32 heads, for decode_layer.c: x * cos + rotate_half(x) * sin as
// minisgl/layers/rotary.py computes it, each product and the sum rounded on its own (the source is
// built in ISO C mode, which does not contract them into fused multiply-adds).
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
