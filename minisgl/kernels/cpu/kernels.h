// The kernels' entry points, shared by decode_layer.c (which chains them) and native.py (ctypes).
#pragma once
#include <immintrin.h>
#include <stdint.h>

// fp32 -> bf16, rounded to nearest even (torch's cast): the pool's and the dequantized weights' rounding.
static inline __m256i round_to_bf16(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

void int4_matmul(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                 const uint16_t *minimum, int64_t N, float *y, int threads);
void int8_matmul(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                 float *y, int threads);
int paged_decode_attention(const float *q, const float *k, const float *v, const int64_t *out_slots, void *k_pool,
                           void *v_pool, int kv_bf16, const int64_t *kv_slots, int64_t stride, const int64_t *kv_lens,
                           int64_t batch, int64_t heads, int64_t kv_heads, int64_t d, float scale, float *out,
                           int threads);
void rms_norm(const float *x, const float *delta, float *sum_out, const float *weight, int64_t rows, int64_t n,
              float eps, float *out, int threads);
void rotary(const float *x, int64_t stride, int64_t tokens, int64_t heads, int64_t d, const float *cos,
            const float *sin, float *out);
void int4_dequantize_bf16(const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum, int64_t K,
                          int64_t row0, int64_t rows, uint16_t *out, int threads);
void int8_dequantize_bf16(const int8_t *codes, const float *scale, int64_t K, int64_t row0, int64_t rows,
                          uint16_t *out, int threads);
