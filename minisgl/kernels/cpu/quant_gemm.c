// Weight-only quantized matrix products for decode on the CPU: y[r, o] = sum_k x[r, k] * w[o, k].
//
// Decode reads every weight once per step for one to a few rows of x, so these loops stream the
// quantized weight once and apply it to all rows. minisgl/kernels/native.py builds this file with
// the host's -march; without AVX-512 VNNI it does not build and torch's kernels run instead. The
// products are integer dot products (vpdpbusd, vpdpwssd), as in llama.cpp, with x written as two
// int8 digits per group of 32 (int4 weights) or rounded to int16 per row (int8 weights).
//
// int4 (`int4_matmul`): one fp16 scale and minimum per group of 32 input columns, w = q * scale + min.
//   The codes of two neighbouring groups (64 columns) sit in 32 bytes, laid out for the unpacking:
//   byte i holds column e(i) in its low nibble and e(i + 32) in its high one, where for j = 4L + b
//   (lane L = 0..15, b = 0..3) e(j) = (L % 2) * 32 + (L / 2) * 4 + b. A 512-bit register of the 32
//   low nibbles then the 32 high ones has in each 32-bit lane four columns of one group, the groups
//   alternating by lane, which is the order of fp16 -> fp32 converted (scale0, scale1) pairs.
//   (`Int4Weight.from_codes` in minisgl/layers/quant.py builds it.)
// int8 (`int8_matmul`): int8 codes, one fp32 scale per output row, w = q * scale.
//
// Threads: output rows are split over `threads` OpenMP threads (torch's own runtime: it is loaded
// first and shares the soname).

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include <stdlib.h>
#include <string.h>

#define GROUP 32
#define PAIR 64      // columns of two groups: one 32-byte block of int4 codes
#define MAX_ROWS 4   // rows of x applied per pass over the weight; more rows take several passes
#define OUT_TILE 4   // output rows interleaved per pass: independent accumulator chains
#define PREFETCH_ROWS 32

#if !(defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__))
#error "these kernels need AVX-512 (F, BW, VNNI) and F16C; torch's kernels run instead"
#endif

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// One row of x for the int4 dot products: per pair of groups, its two int8 digits in the weights'
// column order and their step as an alternating (step0, step1) vector; per group the
// sum of the fp32 values (for the minimum's term), zero padded to a multiple of 16 groups.
static void prepare_int4_row(const float *x, int64_t K, int8_t *codes, __m512 *steps, float *sums) {
    const int64_t pairs = K / PAIR;
    const __m512 scale_low = _mm512_set1_ps(256.0f);
    // Group 0's and group 1's 4-byte chunks alternate in the weights' order (e(j) above).
    const __m512i interleave = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t p = 0; p < pairs; p++) {
        __m256i high[2], low[2];
        float step[2];
        for (int g = 0; g < 2; g++) {
            const float *xg = x + p * PAIR + g * GROUP;
            const __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
            sums[2 * p + g] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
            step[g] = amax / 127.0f;
            const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            __m128i h[2], l[2];
            const __m512 halves[2] = {a, b};
            for (int i = 0; i < 2; i++) {
                // Two int8 digits per value: x / step ~ high + low / 256, 15 bits in all (one digit
                // alone, 7 bits, cost 3x the error of bf16 activations).
                const __m512 v = _mm512_mul_ps(halves[i], inverse);
                const __m512 rounded = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                h[i] = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(rounded));
                l[i] = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(v, rounded), scale_low)));
            }
            high[g] = _mm256_set_m128i(h[1], h[0]);
            low[g] = _mm256_set_m128i(l[1], l[0]);
        }
        int8_t *out = codes + 2 * p * PAIR;
        _mm512_storeu_si512((void *)out, _mm512_permutex2var_epi32(_mm512_castsi256_si512(high[0]), interleave, _mm512_castsi256_si512(high[1])));
        _mm512_storeu_si512((void *)(out + PAIR), _mm512_permutex2var_epi32(_mm512_castsi256_si512(low[0]), interleave, _mm512_castsi256_si512(low[1])));
        const float s0 = step[0] / 256.0f, s1 = step[1] / 256.0f;  // of the combined high * 256 + low
        steps[p] = _mm512_set_ps(s1, s0, s1, s0, s1, s0, s1, s0, s1, s0, s1, s0, s1, s0, s1, s0);
    }
}

// T output rows against R rows of x, both compile-time constants (always inlined with literals),
// so that the T * R accumulators stay in registers.
static inline __attribute__((always_inline)) void int4_tile(
    const int64_t T, const int64_t R, int64_t K, const uint8_t *codes, const uint16_t *scale,
    const uint16_t *minimum, int64_t o0, int64_t N, float *y, const int8_t *xcodes, const __m512 *xsteps,
    const float *xsums) {
    const int64_t pairs = K / PAIR, groups = K / GROUP, padded = (groups + 15) / 16 * 16;
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    __m512 acc[OUT_TILE][MAX_ROWS];
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < R; r++) acc[t][r] = _mm512_setzero_ps();
    if (o0 + PREFETCH_ROWS + T <= N)
        for (int64_t t = 0; t < T; t++) {
            _mm_prefetch((const char *)(scale + (o0 + PREFETCH_ROWS + t) * groups), _MM_HINT_T0);
            _mm_prefetch((const char *)(minimum + (o0 + PREFETCH_ROWS + t) * groups), _MM_HINT_T0);
        }
    for (int64_t p = 0; p < pairs; p++) {
        // Short rows (a few cache lines each) give the hardware prefetcher no stream to learn:
        // fetch the rows PREFETCH_ROWS ahead while these are multiplied.
        if (o0 + PREFETCH_ROWS + T <= N)
            for (int64_t t = 0; t < T; t++) _mm_prefetch((const char *)(codes + (o0 + PREFETCH_ROWS + t) * (K / 2) + p * 32), _MM_HINT_T0);
        for (int64_t t = 0; t < T; t++) {
            const int64_t o = o0 + t;
            const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + o * (K / 2) + p * 32));
            const __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
            const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            uint32_t pair_scales;
            memcpy(&pair_scales, scale + o * groups + 2 * p, sizeof pair_scales);
            const __m512 s = _mm512_cvtph_ps(_mm256_set1_epi32((int)pair_scales));
            for (int64_t r = 0; r < R; r++) {
                const int8_t *xq = xcodes + (r * pairs + p) * 2 * PAIR;
                const __m512i high = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512((const void *)xq));
                const __m512i low = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512((const void *)(xq + PAIR)));
                // |high| <= 4 * 15 * 127 per lane: shifted by 8 bits it stays far inside int32.
                const __m512i digits = _mm512_add_epi32(_mm512_slli_epi32(high, 8), low);
                const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(digits), xsteps[r * pairs + p]);
                acc[t][r] = _mm512_fmadd_ps(dot, s, acc[t][r]);
            }
        }
    }
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *m = minimum + (o0 + t) * groups;
        for (int64_t r = 0; r < R; r++) {
            // The minimum's term: sum over groups of min * (sum of x over the group), in fp32.
            __m512 shift = _mm512_setzero_ps();
            for (int64_t g = 0; g < padded; g += 16) {
                const __mmask16 live = (__mmask16)((1u << min64(16, groups - g)) - 1);
                const __m512 mins = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, m + g));
                shift = _mm512_fmadd_ps(mins, _mm512_loadu_ps(xsums + r * padded + g), shift);
            }
            y[r * N + o0 + t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][r], shift));
        }
    }
}

#define INT4_ROWS(R)                                                                                          \
    static void int4_rows_##R(int64_t K, const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum,  \
                              int64_t begin, int64_t end, int64_t N, float *y, const int8_t *xc,              \
                              const __m512 *xs, const float *xsum) {                                          \
        int64_t o = begin;                                                                                    \
        for (; o + OUT_TILE <= end; o += OUT_TILE) int4_tile(OUT_TILE, R, K, codes, scale, minimum, o, N, y, xc, xs, xsum); \
        for (; o < end; o++) int4_tile(1, R, K, codes, scale, minimum, o, N, y, xc, xs, xsum);                \
    }
INT4_ROWS(1)
INT4_ROWS(2)
INT4_ROWS(3)
INT4_ROWS(4)

static void int4_block(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                       const uint16_t *minimum, int64_t N, float *y, int threads) {
    const int64_t pairs = K / PAIR, groups = K / GROUP, padded = (groups + 15) / 16 * 16;
    int8_t *xc = aligned_alloc(64, (size_t)(rows * pairs * 2 * PAIR));
    __m512 *xs = aligned_alloc(64, sizeof(__m512) * (size_t)(rows * pairs));
    float *xsum = calloc((size_t)(rows * padded), sizeof(float));
    for (int64_t r = 0; r < rows; r++)
        prepare_int4_row(x + r * K, K, xc + r * pairs * 2 * PAIR, xs + r * pairs, xsum + r * padded);
    const int64_t tiles = (N + OUT_TILE - 1) / OUT_TILE;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t begin = t * OUT_TILE, end = min64(begin + OUT_TILE, N);
        switch (rows) {
            case 1: int4_rows_1(K, codes, scale, minimum, begin, end, N, y, xc, xs, xsum); break;
            case 2: int4_rows_2(K, codes, scale, minimum, begin, end, N, y, xc, xs, xsum); break;
            case 3: int4_rows_3(K, codes, scale, minimum, begin, end, N, y, xc, xs, xsum); break;
            default: int4_rows_4(K, codes, scale, minimum, begin, end, N, y, xc, xs, xsum); break;
        }
    }
    free(xc);
    free(xs);
    free(xsum);
}


// x: [rows, K] fp32 (K a multiple of 64), codes: [N, K / 2] in the layout above, scale and
// minimum: [N, K / 32] fp16, y: [rows, N] fp32.
void int4_matmul(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                 const uint16_t *minimum, int64_t N, float *y, int threads) {
    for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS)
        int4_block(x + r0 * K, min64(MAX_ROWS, rows - r0), K, codes, scale, minimum, N, y + r0 * N, threads);
}

#define INT8_CHUNK 4096  // columns summed in int32 before going to fp32: |x| <= 32767, |q| <= 127

static inline __attribute__((always_inline)) void int8_tile(
    const int64_t T, const int64_t R, int64_t K, const int8_t *codes, const float *scale, int64_t o0, int64_t N,
    float *y, const int16_t *xq, const float *xstep) {
    __m512 acc[OUT_TILE][MAX_ROWS];
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < R; r++) acc[t][r] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += INT8_CHUNK) {
        const int64_t k1 = min64(K, k0 + INT8_CHUNK);
        __m512i dot[OUT_TILE][MAX_ROWS];
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < R; r++) dot[t][r] = _mm512_setzero_si512();
        for (int64_t k = k0; k < k1; k += 32) {
            if (o0 + PREFETCH_ROWS + T <= N)
                for (int64_t t = 0; t < T; t++) _mm_prefetch((const char *)(codes + (o0 + PREFETCH_ROWS + t) * K + k), _MM_HINT_T0);
            for (int64_t t = 0; t < T; t++) {
                const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(codes + (o0 + t) * K + k)));
                for (int64_t r = 0; r < R; r++)
                    dot[t][r] = _mm512_dpwssd_epi32(dot[t][r], w, _mm512_loadu_si512((const void *)(xq + r * K + k)));
            }
        }
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < R; r++) acc[t][r] = _mm512_add_ps(acc[t][r], _mm512_cvtepi32_ps(dot[t][r]));
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < R; r++) y[r * N + o0 + t] = _mm512_reduce_add_ps(acc[t][r]) * xstep[r] * scale[o0 + t];
}

#define INT8_ROWS(R)                                                                                        \
    static void int8_rows_##R(int64_t K, const int8_t *codes, const float *scale, int64_t begin, int64_t end, \
                              int64_t N, float *y, const int16_t *xq, const float *xstep) {                  \
        int64_t o = begin;                                                                                  \
        for (; o + OUT_TILE <= end; o += OUT_TILE) int8_tile(OUT_TILE, R, K, codes, scale, o, N, y, xq, xstep); \
        for (; o < end; o++) int8_tile(1, R, K, codes, scale, o, N, y, xq, xstep);                         \
    }
INT8_ROWS(1)
INT8_ROWS(2)
INT8_ROWS(3)
INT8_ROWS(4)

static void int8_block(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                       float *y, int threads) {
    // x rounded to int16 per row: 15 bits below its largest value, finer than bf16's 8 bits.
    int16_t *xq = aligned_alloc(64, sizeof(int16_t) * (size_t)(rows * K) + 64);
    float xstep[MAX_ROWS];
    for (int64_t r = 0; r < rows; r++) {
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(x[r * K + k]));
        xstep[r] = amax / 32767.0f;
        for (int64_t k = 0; k < K; k++) xq[r * K + k] = (int16_t)(amax > 0.0f ? nearbyintf(x[r * K + k] / xstep[r]) : 0.0f);
    }
    // Tiles of 64 output rows: the LM head's 49k rows split evenly, each thread streaming its own.
    const int64_t span = 64, spans = (N + span - 1) / span;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < spans; i++) {
        const int64_t begin = i * span, end = min64(begin + span, N);
        switch (rows) {
            case 1: int8_rows_1(K, codes, scale, begin, end, N, y, xq, xstep); break;
            case 2: int8_rows_2(K, codes, scale, begin, end, N, y, xq, xstep); break;
            case 3: int8_rows_3(K, codes, scale, begin, end, N, y, xq, xstep); break;
            default: int8_rows_4(K, codes, scale, begin, end, N, y, xq, xstep); break;
        }
    }
    free(xq);
}


// x: [rows, K] fp32 (K a multiple of 32), codes: [N, K] int8, scale: [N] fp32, y: [rows, N] fp32.
void int8_matmul(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                 float *y, int threads) {
    for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS)
        int8_block(x + r0 * K, min64(MAX_ROWS, rows - r0), K, codes, scale, N, y + r0 * N, threads);
}
