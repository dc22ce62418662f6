// One decoder layer's decode step in one call: the other kernels chained, with nothing between
// them. Through Python the same chain is ~15 calls and ~25 small torch ops a layer, about a third
// of a step at one request on 2 cores.
//
// The layer is minisgl/models/decoder.py's with a dense MLP: RMSNorm, fused QKV (plus its bias for
// Qwen2), Q/K head norms (Qwen3), RoPE, paged attention (which stores the new K/V), output projection,
// residual add and RMSNorm, fused gate/up, SiLU(gate) * up, down projection; each projection int4 or
// int8. Each row is one request's new token. The structs (Layer, Step) are declared in kernels.h, the boundary.

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

// y [rows, N] = x [rows, K] W^T through the weight's own kernel, x at one int8 digit as every layer's
// products take it (layers/quant.py).
static int project(const Projection *w, const Step *s, const float *x, int64_t K, int64_t N, float *y) {
    if (w->bits == 4)
        return int4_gemm(x, 1, s->batch, K, w->int4.codes, w->int4.scale, w->int4.minimum, N, y, s->threads);
    if (w->bits == 8) return int8_gemm(x, 1, s->batch, K, w->int8.codes, w->int8.scale, N, y, s->threads);
    return KERNELS_BAD_SHAPE;
}

int64_t decode_layer_scratch(int64_t batch, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                             int64_t intermediate) {
    const int64_t qkv = (heads + 2 * kv_heads) * head_dim, qk = (heads + kv_heads) * head_dim;
    return batch * (2 * hidden + qkv + qk + heads * head_dim + 3 * intermediate);
}

// delta: [batch, hidden], added to the residual stream `residual` (in place) unless `first`,
// where delta is the stream itself (copied in); out: [batch, hidden], the MLP's output, which
// the next layer adds. Returns a kernel's error code, or KERNELS_OK.
static int decode_layer(const Layer *l, const Step *s, const float *delta, int first, float *residual, float *out) {
    const int64_t b = s->batch, d = l->head_dim, qk_heads = l->heads + l->kv_heads;
    const int64_t qkv_width = (qk_heads + l->kv_heads) * d, q_width = l->heads * d;
    float *h = s->scratch, *qkv = h + b * l->hidden, *qk = qkv + b * qkv_width, *attn = qk + b * qk_heads * d;
    float *o = attn + b * q_width;
    float *gate_up = o + b * l->hidden, *act = gate_up + 2 * b * l->intermediate;
    const size_t element = s->kv_bf16 ? sizeof(uint16_t) : sizeof(float);
    void *k_pool = (char *)s->k_pool + (size_t)(l->layer * s->pool_layer_stride) * element;
    void *v_pool = (char *)s->v_pool + (size_t)(l->layer * s->pool_layer_stride) * element;

    if (first) {
        memcpy(residual, delta, sizeof(float) * (size_t)(b * l->hidden));
        rms_norm(residual, 0, 0, l->input_norm, b, l->hidden, l->eps, h, s->threads);
    } else {
        rms_norm(residual, delta, residual, l->input_norm, b, l->hidden, l->eps, h, s->threads);
    }
    int failed = project(&l->qkv, s, h, l->hidden, qkv_width, qkv);
    if (failed) return failed;
    if (l->qkv_bias != NULL)
        for (int64_t r = 0; r < b; r++)
            for (int64_t i = 0; i < qkv_width; i++) qkv[r * qkv_width + i] += l->qkv_bias[i];
    if (l->q_norm != NULL)  // in place, one row per head (rms_norm reads each value before writing it)
        for (int64_t r = 0; r < b; r++) {
            float *row = qkv + r * qkv_width;
            rms_norm(row, 0, 0, l->q_norm, l->heads, d, l->eps, row, 1);
            rms_norm(row + q_width, 0, 0, l->k_norm, l->kv_heads, d, l->eps, row + q_width, 1);
        }
    rotary(qkv, qkv_width, b, qk_heads, d, s->cos, s->sin, qk, s->threads);
    // Q and K (rotated) from qk's rows, V from qkv's, where they lie.
    failed = paged_decode_attention(qk, qk_heads * d, qk + q_width, qk_heads * d, qkv + qk_heads * d, qkv_width,
                                    s->out_slots, k_pool, v_pool, s->pool_slots, s->kv_bf16, s->kv_slots, s->kv_stride,
                                    s->kv_lens, b, l->heads, l->kv_heads, d, 1.0f / sqrtf((float)d), attn, s->threads);
    if (failed) return failed;
    failed = project(&l->o, s, attn, q_width, l->hidden, o);
    if (failed) return failed;
    rms_norm(residual, o, residual, l->post_norm, b, l->hidden, l->eps, h, s->threads);
    failed = project(&l->gate_up, s, h, l->hidden, 2 * l->intermediate, gate_up);
    if (failed) return failed;
    silu_mul(gate_up, b, l->intermediate, act, s->threads);
    return project(&l->down, s, act, l->intermediate, l->hidden, out);
}

// All `count` layers in turn: x [batch, hidden] is the embedded input; out receives the last
// layer's MLP output and residual the stream before it (their sum is the final hidden state).
// `buffer` holds [batch, hidden] for the outputs between layers.
int decode_layers(const Layer *layers, int64_t count, const Step *s, const float *x, float *residual, float *out,
                  float *buffer) {
    const float *delta = x;
    for (int64_t i = 0; i < count; i++) {
        // Alternate the output between `out` and `buffer` so that the last one lands in `out`.
        float *target = (count - 1 - i) % 2 == 0 ? out : buffer;
        const int failed = decode_layer(&layers[i], s, delta, i == 0, residual, target);
        if (failed) return failed;
        delta = target;
    }
    return KERNELS_OK;
}
