// The kernels' entry points, shared by decode_layer.c (which chains them) and native.py (ctypes).
#pragma once
#include <stdint.h>

void int4_matmul(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                 const uint16_t *minimum, int64_t N, float *y, int threads);
void int8_matmul(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                 float *y, int threads);
int paged_decode_attention(const float *q, const float *k, const float *v, const int64_t *out_slots, float *k_pool,
                           float *v_pool, const int64_t *kv_slots, int64_t stride, const int64_t *kv_lens,
                           int64_t batch, int64_t heads, int64_t kv_heads, int64_t d, float scale, float *out,
                           int threads);
void rms_norm(const float *x, const float *delta, float *sum_out, const float *weight, int64_t rows, int64_t n,
              float eps, float *out, int threads);
void rotary(const float *x, int64_t stride, int64_t tokens, int64_t heads, int64_t d, const float *cos,
            const float *sin, float *out);
