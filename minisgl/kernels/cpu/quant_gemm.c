// The weight-only int8 product for few rows (decode): y[r, o] = sum_k x[r, k] * w[o, k].
//
// Decode reads every weight once per step for one to a few rows of x, so this loop streams the int8
// weight once and applies it to all rows. The products are integer dot products, as in llama.cpp,
// with x rounded to int16 per row: vpdpwssd with AVX-512 VNNI (512-bit) or AVX-VNNI (256-bit), and
// with AVX2 alone the same sums through vpmaddwd (simd.h's dot_s16). The plain C reference
// (`int8_matmul_ref`) computes the same integers, summed in another order. (int4 weights have their
// own kernel for every row count, int4_gemm.c.)
//
// int8 (`int8_matmul`): int8 codes, one fp32 scale per output row, w = q * scale.
//
// Threads: output rows are split over `threads` OpenMP threads (torch's own runtime: it is loaded
// first and shares the soname).

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

#define MAX_ROWS 4       // rows of x applied per pass over the weight; more rows take several passes
#define OUT_TILE 4       // output rows interleaved per pass: independent accumulator chains
#define PREFETCH_ROWS 32
#define INT8_CHUNK 4096  // columns summed in int32 before going to fp32: |x| <= 32767, |q| <= 127, and
                         // an 8-lane body sums 512 products a lane per chunk (< 2^31)

const char *kernels_variant(void) { return KERNELS_VARIANT; }

// x rounded to int16 per row: 15 bits below its largest value, finer than bf16's 8 bits. Returns the step.
static float prepare_int8_row(const float *x, int64_t K, int16_t *xq) {
    float amax = 0.0f;
    for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(x[k]));
    const float step = amax / 32767.0f;
    for (int64_t k = 0; k < K; k++) xq[k] = (int16_t)(amax > 0.0f ? nearbyintf(x[k] / step) : 0.0f);
    return step;
}

// ---- references ---------------------------------------------------------------------------------

int int8_matmul_ref(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                    float *y) {
    int16_t *xq = malloc(sizeof(int16_t) * (size_t)(K + 1));
    if (xq == NULL) return KERNELS_NO_MEMORY;
    for (int64_t r = 0; r < rows; r++) {
        const float step = prepare_int8_row(x + r * K, K, xq);
        for (int64_t o = 0; o < N; o++) {
            int64_t total = 0;
            for (int64_t k = 0; k < K; k++) total += (int64_t)codes[o * K + k] * xq[k];
            y[r * N + o] = (float)total * step * scale[o];
        }
    }
    free(xq);
    return KERNELS_OK;
}

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)

// ---- int8 ---------------------------------------------------------------------------------------

#if defined(KERNELS_AVX512)
typedef __m512 VecF;
typedef __m512i VecI;
#define INT8_STEP 32  // columns per register of int16
#define vec_zero_ps _mm512_setzero_ps
#define vec_zero_si _mm512_setzero_si512
#define vec_add_ps _mm512_add_ps
#define vec_cvt_ps _mm512_cvtepi32_ps
#define vec_sum _mm512_reduce_add_ps
#define load_codes16(p) _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p)))
#define load_x16(p) _mm512_loadu_si512((const void *)(p))
#define dot16(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
#else
typedef __m256 VecF;
typedef __m256i VecI;
#define INT8_STEP 16
#define vec_zero_ps _mm256_setzero_ps
#define vec_zero_si _mm256_setzero_si256
#define vec_add_ps _mm256_add_ps
#define vec_cvt_ps _mm256_cvtepi32_ps
#define vec_sum sum256
#define load_codes16(p) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p)))
#define load_x16(p) _mm256_loadu_si256((const __m256i *)(p))
#define dot16(acc, a, b) dot_s16(acc, a, b)
#endif

static inline __attribute__((always_inline)) void int8_tile(
    const int64_t T, const int64_t R, int64_t K, const int8_t *codes, const float *scale, int64_t o0, int64_t N,
    float *y, const int16_t *xq, const float *xstep) {
    VecF acc[OUT_TILE][MAX_ROWS];
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < R; r++) acc[t][r] = vec_zero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += INT8_CHUNK) {
        const int64_t k1 = min64(K, k0 + INT8_CHUNK);
        VecI dot[OUT_TILE][MAX_ROWS];
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < R; r++) dot[t][r] = vec_zero_si();
        for (int64_t k = k0; k < k1; k += INT8_STEP) {
            if (o0 + PREFETCH_ROWS + T <= N && k % 64 == 0)
                for (int64_t t = 0; t < T; t++) _mm_prefetch((const char *)(codes + (o0 + PREFETCH_ROWS + t) * K + k), _MM_HINT_T0);
            for (int64_t t = 0; t < T; t++) {
                const VecI w = load_codes16(codes + (o0 + t) * K + k);
                for (int64_t r = 0; r < R; r++) dot[t][r] = dot16(dot[t][r], w, load_x16(xq + r * K + k));
            }
        }
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < R; r++) acc[t][r] = vec_add_ps(acc[t][r], vec_cvt_ps(dot[t][r]));
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < R; r++) y[r * N + o0 + t] = vec_sum(acc[t][r]) * xstep[r] * scale[o0 + t];
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

static int int8_block(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                      float *y, int threads) {
    static _Thread_local Scratch scratch;
    int16_t *xq = scratch_reserve(&scratch, sizeof(int16_t) * (size_t)(rows * K));
    if (xq == NULL) return KERNELS_NO_MEMORY;
    float xstep[MAX_ROWS];
    for (int64_t r = 0; r < rows; r++) xstep[r] = prepare_int8_row(x + r * K, K, xq + r * K);
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
    return KERNELS_OK;
}

// x: [rows, K] fp32 (K a multiple of 32), codes: [N, K] int8, scale: [N] fp32, y: [rows, N] fp32.
int int8_matmul(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                float *y, int threads) {
    if (K % 32) return KERNELS_BAD_SHAPE;
    for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS) {
        const int failed = int8_block(x + r0 * K, min64(MAX_ROWS, rows - r0), K, codes, scale, N, y + r0 * N, threads);
        if (failed) return failed;
    }
    return KERNELS_OK;
}

#else  // no SIMD: the references are the bodies

int int8_matmul(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                float *y, int threads) {
    (void)threads;
    return int8_matmul_ref(x, rows, K, codes, scale, N, y);
}

#endif
