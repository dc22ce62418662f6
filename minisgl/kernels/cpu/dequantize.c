// Quantized weights expanded to bf16, a band of output rows at a time, for the many-row products
// (prefill, large decode batches): there the arithmetic, not the weight's bytes, sets the time, and
// torch's bf16 GEMM (oneDNN, AMX where the CPU has it) beats the integer kernels of quant_gemm.c.
// The caller reuses one small buffer for every layer, so no dense copy of the model is ever held.
//
// bf16 is rounded to nearest even from the fp32 value code * scale + minimum (int4) or code *
// scale (int8), as torch's fp32 -> bf16 cast rounds.
//
// Threads: output rows are split over `threads` OpenMP threads.

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#define GROUP 32
#define PAIR 64

// Rows [row0, row0 + rows) of an int4 weight (quant_gemm.c's layout) into out: [rows, K] bf16.
void int4_dequantize_bf16(const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum, int64_t K,
                          int64_t row0, int64_t rows, uint16_t *out, int threads) {
    const int64_t pairs = K / PAIR, groups = K / GROUP;
    // The 16 lanes of (low nibbles, high nibbles) hold columns 0-3, 32-35, 4-7, 36-39, ...: even
    // lanes first puts the 64 columns in order.
    const __m512i order = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m256i nibble = _mm256_set1_epi8(0x0F);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = row0 + r;
        for (int64_t p = 0; p < pairs; p++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + o * (K / 2) + p * 32));
            const __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
            const __m512i q = _mm512_permutexvar_epi32(order, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
            uint8_t column[PAIR];
            _mm512_storeu_si512((void *)column, q);
            for (int64_t c = 0; c < PAIR; c += 16) {
                const int64_t g = o * groups + 2 * p + c / GROUP;
                const __m512 s = _mm512_set1_ps(_cvtsh_ss(scale[g])), m = _mm512_set1_ps(_cvtsh_ss(minimum[g]));
                const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(column + c))));
                _mm256_storeu_si256((__m256i *)(out + r * K + p * PAIR + c), round_to_bf16(_mm512_fmadd_ps(w, s, m)));
            }
        }
    }
}

// Rows [row0, row0 + rows) of an int8 weight into out: [rows, K] bf16 (K a multiple of 16).
void int8_dequantize_bf16(const int8_t *codes, const float *scale, int64_t K, int64_t row0, int64_t rows,
                          uint16_t *out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = row0 + r;
        const __m512 s = _mm512_set1_ps(scale[o]);
        for (int64_t k = 0; k < K; k += 16) {
            const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(codes + o * K + k))));
            _mm256_storeu_si256((__m256i *)(out + r * K + k), round_to_bf16(_mm512_mul_ps(w, s)));
        }
    }
}
