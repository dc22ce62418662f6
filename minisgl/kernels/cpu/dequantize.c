// int8 weights expanded to bf16, a band of output rows at a time, for their many-row products
// (prefill, large decode batches): there the arithmetic, not the weight's bytes, sets the time, and
// torch's bf16 GEMM (oneDNN, AMX where the CPU has it) beats quant_gemm.c's few-row loops. The caller
// reuses one small buffer for every layer, so no dense copy of the model is ever held.
//
// bf16 is rounded to nearest even from the fp32 value code * scale, as torch's fp32 -> bf16 cast
// rounds. The SIMD bodies compute exactly the reference's values (one product per weight).
//
// Threads: output rows are split over `threads` OpenMP threads.

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

void int8_dequantize_bf16_ref(const int8_t *codes, const float *scale, int64_t K, int64_t row0, int64_t rows,
                              uint16_t *out) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < K; k++) out[r * K + k] = bf16_of((float)codes[(row0 + r) * K + k] * scale[row0 + r]);
}

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)

// Rows [row0, row0 + rows) of an int8 weight into out: [rows, K] bf16 (K a multiple of 16).
void int8_dequantize_bf16(const int8_t *codes, const float *scale, int64_t K, int64_t row0, int64_t rows,
                          uint16_t *out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = row0 + r;
#if defined(KERNELS_AVX512)
        const __m512 s = _mm512_set1_ps(scale[o]);
        for (int64_t k = 0; k < K; k += 16) {
            const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(codes + o * K + k))));
            _mm256_storeu_si256((__m256i *)(out + r * K + k), round_to_bf16_512(_mm512_mul_ps(w, s)));
        }
#else
        const __m256 s = _mm256_set1_ps(scale[o]);
        for (int64_t k = 0; k < K; k += 8) {
            const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(codes + o * K + k))));
            _mm_storeu_si128((__m128i *)(out + r * K + k), round_to_bf16_256(_mm256_mul_ps(w, s)));
        }
#endif
    }
}

#else  // no SIMD: the references are the bodies

void int8_dequantize_bf16(const int8_t *codes, const float *scale, int64_t K, int64_t row0, int64_t rows,
                          uint16_t *out, int threads) {
    (void)threads;
    int8_dequantize_bf16_ref(codes, scale, K, row0, rows, out);
}

#endif
