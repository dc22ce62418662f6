// Quantized weights expanded to bf16, a band of output rows at a time, for the many-row products
// (prefill, large decode batches): there the arithmetic, not the weight's bytes, sets the time, and
// torch's bf16 GEMM (oneDNN, AMX where the CPU has it) beats the integer kernels of quant_gemm.c.
// The caller reuses one small buffer for every layer, so no dense copy of the model is ever held.
//
// bf16 is rounded to nearest even from the fp32 value code * scale + minimum (int4) or code *
// scale (int8), as torch's fp32 -> bf16 cast rounds. The SIMD bodies compute exactly the references'
// values (one fused multiply-add or one product per weight).
//
// Threads: output rows are split over `threads` OpenMP threads.

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

#define GROUP 32
#define PAIR 64

void int4_dequantize_bf16_ref(const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum, int64_t K,
                              int64_t row0, int64_t rows, uint16_t *out) {
    const int64_t groups = K / GROUP;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = row0 + r;
        for (int64_t p = 0; p < K / PAIR; p++)
            for (int64_t j = 0; j < PAIR; j++) {  // nibble position j holds column e(j) (quant_gemm.c)
                const int64_t lane = j / 4, column = (lane % 2) * GROUP + (lane / 2) * 4 + j % 4;
                const uint8_t byte = codes[o * (K / 2) + p * 32 + j % 32];
                const float q = (float)(j < 32 ? byte & 0x0F : byte >> 4);
                const int64_t g = o * groups + 2 * p + column / GROUP;
                out[r * K + p * PAIR + column] = bf16_of(fmaf(q, float_of_fp16(scale[g]), float_of_fp16(minimum[g])));
            }
    }
}

void int8_dequantize_bf16_ref(const int8_t *codes, const float *scale, int64_t K, int64_t row0, int64_t rows,
                              uint16_t *out) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < K; k++) out[r * K + k] = bf16_of((float)codes[(row0 + r) * K + k] * scale[row0 + r]);
}

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)

// Rows [row0, row0 + rows) of an int4 weight (quant_gemm.c's layout) into out: [rows, K] bf16.
void int4_dequantize_bf16(const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum, int64_t K,
                          int64_t row0, int64_t rows, uint16_t *out, int threads) {
    const int64_t pairs = K / PAIR, groups = K / GROUP;
    const __m256i nibble = _mm256_set1_epi8(0x0F);
#if defined(KERNELS_AVX512)
    // The 16 lanes of (low nibbles, high nibbles) hold columns 0-3, 32-35, 4-7, 36-39, ...: even
    // lanes first puts the 64 columns in order.
    const __m512i order = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
#else
    // The same in each 8-lane half: its even lanes are 16 columns of group 0, its odd ones of group 1.
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
#endif
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = row0 + r;
        for (int64_t p = 0; p < pairs; p++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + o * (K / 2) + p * 32));
            const __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
            uint8_t column[PAIR];
#if defined(KERNELS_AVX512)
            _mm512_storeu_si512((void *)column, _mm512_permutexvar_epi32(order, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)));
            for (int64_t c = 0; c < PAIR; c += 16) {
                const int64_t g = o * groups + 2 * p + c / GROUP;
                const __m512 s = _mm512_set1_ps(_cvtsh_ss(scale[g])), m = _mm512_set1_ps(_cvtsh_ss(minimum[g]));
                const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(column + c))));
                _mm256_storeu_si256((__m256i *)(out + r * K + p * PAIR + c), round_to_bf16_512(_mm512_fmadd_ps(w, s, m)));
            }
#else
            const __m256i a = _mm256_permutevar8x32_epi32(lo, order), b = _mm256_permutevar8x32_epi32(hi, order);
            _mm256_storeu_si256((__m256i *)column, _mm256_permute2x128_si256(a, b, 0x20));        // columns 0-31
            _mm256_storeu_si256((__m256i *)(column + 32), _mm256_permute2x128_si256(a, b, 0x31));  // columns 32-63
            for (int64_t c = 0; c < PAIR; c += 8) {
                const int64_t g = o * groups + 2 * p + c / GROUP;
                const __m256 s = _mm256_set1_ps(_cvtsh_ss(scale[g])), m = _mm256_set1_ps(_cvtsh_ss(minimum[g]));
                const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(column + c))));
                _mm_storeu_si128((__m128i *)(out + r * K + p * PAIR + c), round_to_bf16_256(_mm256_fmadd_ps(w, s, m)));
            }
#endif
        }
    }
}

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

void int4_dequantize_bf16(const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum, int64_t K,
                          int64_t row0, int64_t rows, uint16_t *out, int threads) {
    (void)threads;
    int4_dequantize_bf16_ref(codes, scale, minimum, K, row0, rows, out);
}

void int8_dequantize_bf16(const int8_t *codes, const float *scale, int64_t K, int64_t row0, int64_t rows,
                          uint16_t *out, int threads) {
    (void)threads;
    int8_dequantize_bf16_ref(codes, scale, K, row0, rows, out);
}

#endif
