// Weight-only quantized matrix products for decode on the CPU: y[r, o] = sum_k x[r, k] * w[o, k].
//
// Decode reads every weight once per step for one to a few rows of x, so these loops stream the
// quantized weight once and apply it to all rows. The products are integer dot products, as in
// llama.cpp, with x written as two int8 digits per group of 32 (int4 weights) or rounded to int16
// per row (int8 weights): vpdpbusd / vpdpwssd with AVX-512 VNNI (512-bit) or AVX-VNNI (256-bit), and
// with AVX2 alone the same sums through vpmaddubsw + vpmaddwd (simd.h's dot2_u8s8, dot_s16). The
// plain C references (`*_ref`) compute the same integers, summed in another order.
//
// int4 (`int4_matmul`): one fp16 scale and minimum per group of 32 input columns, w = q * scale + min.
//   The codes of two neighbouring groups (64 columns) sit in 32 bytes, laid out for the unpacking:
//   byte i holds column e(i) in its low nibble and e(i + 32) in its high one, where for j = 4L + b
//   (lane L = 0..15, b = 0..3) e(j) = (L % 2) * 32 + (L / 2) * 4 + b. A 512-bit register of the 32
//   low nibbles then the 32 high ones has in each 32-bit lane four columns of one group, the groups
//   alternating by lane, which is the order of fp16 -> fp32 converted (scale0, scale1) pairs; the
//   256-bit bodies take the low and the high nibbles as two registers of that same lane pattern.
//   (`Int4Weight.from_codes` in minisgl/layers/quant.py builds it.)
// int8 (`int8_matmul`): int8 codes, one fp32 scale per output row, w = q * scale.
//
// Threads: output rows are split over `threads` OpenMP threads (torch's own runtime: it is loaded
// first and shares the soname).

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

#define GROUP 32
#define PAIR 64          // columns of two groups: one 32-byte block of int4 codes
#define PAIR_CODES 128   // x's int8 digits per pair: 64 high, then 64 low
#define LANES 16         // 32-bit lanes of a pair's digits; x's steps are stored per lane
#define MAX_ROWS 4       // rows of x applied per pass over the weight; more rows take several passes
#define OUT_TILE 4       // output rows interleaved per pass: independent accumulator chains
// A single row of x leaves registers for twice the int4 output rows, and more loads in flight: with a
// one-instruction dot product (VNNI) that streams the weight faster (benchmarks.decode_per_byte); the
// plain AVX2 dot needs the registers itself.
#if defined(KERNELS_AVX512) || defined(KERNELS_AVXVNNI)
#define ONE_ROW_TILE 8
#else
#define ONE_ROW_TILE 4
#endif
#define MAX_TILE (ONE_ROW_TILE > OUT_TILE ? ONE_ROW_TILE : OUT_TILE)
#define PREFETCH_ROWS 32
#define INT8_CHUNK 4096  // columns summed in int32 before going to fp32: |x| <= 32767, |q| <= 127, and
                         // an 8-lane body sums 512 products a lane per chunk (< 2^31)

const char *kernels_variant(void) { return KERNELS_VARIANT; }

static inline int8_t saturate8(float v) { return (int8_t)(v > 127.0f ? 127.0f : v < -128.0f ? -128.0f : v); }

// One row of x for the int4 dot products, in plain C: per pair of groups, its two int8 digits at the
// weights' nibble positions and its step per lane (the lanes' groups alternate: step0, step1, ...);
// per group the sum of the fp32 values (for the minimum's term).
static void prepare_int4_row_plain(const float *x, int64_t K, int8_t *codes, float *steps, float *sums) {
    for (int64_t p = 0; p < K / PAIR; p++)
        for (int64_t g = 0; g < 2; g++) {
            const float *xg = x + p * PAIR + g * GROUP;
            float amax = 0.0f, sum = 0.0f;
            for (int64_t i = 0; i < GROUP; i++) {
                amax = fmaxf(amax, fabsf(xg[i]));
                sum += xg[i];
            }
            sums[2 * p + g] = sum;
            const float step = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (int64_t i = 0; i < GROUP; i++) {
                // Two int8 digits per value: x / step ~ high + low / 256, 15 bits in all (one digit
                // alone, 7 bits, cost 3x the error of bf16 activations).
                const float v = xg[i] * inverse, rounded = nearbyintf(v);
                const int64_t j = 4 * (2 * (i / 4) + g) + i % 4;  // e(j) = g * 32 + i
                codes[p * PAIR_CODES + j] = saturate8(rounded);
                codes[p * PAIR_CODES + PAIR + j] = saturate8(nearbyintf((v - rounded) * 256.0f));
            }
            for (int64_t lane = g; lane < LANES; lane += 2) steps[p * LANES + lane] = step / 256.0f;  // of high * 256 + low
        }
}

// x rounded to int16 per row: 15 bits below its largest value, finer than bf16's 8 bits. Returns the step.
static float prepare_int8_row(const float *x, int64_t K, int16_t *xq) {
    float amax = 0.0f;
    for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(x[k]));
    const float step = amax / 32767.0f;
    for (int64_t k = 0; k < K; k++) xq[k] = (int16_t)(amax > 0.0f ? nearbyintf(x[k] / step) : 0.0f);
    return step;
}

// ---- references ---------------------------------------------------------------------------------

int int4_matmul_ref(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                    const uint16_t *minimum, int64_t N, float *y) {
    if (K % PAIR) return KERNELS_BAD_SHAPE;
    const int64_t pairs = K / PAIR, groups = K / GROUP;
    int8_t *xc = malloc((size_t)(pairs * PAIR_CODES) + 1);
    float *steps = malloc(sizeof(float) * (size_t)(pairs * LANES + 1)), *sums = malloc(sizeof(float) * (size_t)(groups + 1));
    const int failed = xc == NULL || steps == NULL || sums == NULL;
    for (int64_t r = 0; r < rows && !failed; r++) {
        prepare_int4_row_plain(x + r * K, K, xc, steps, sums);
        for (int64_t o = 0; o < N; o++) {
            float acc[LANES] = {0};
            for (int64_t p = 0; p < pairs; p++) {
                const uint8_t *c = codes + o * (K / 2) + p * 32;
                const int8_t *xq = xc + p * PAIR_CODES;
                for (int64_t lane = 0; lane < LANES; lane++) {
                    int32_t high = 0, low = 0;
                    for (int64_t j = 4 * lane; j < 4 * lane + 4; j++) {
                        const int32_t w = j < 32 ? c[j] & 0x0F : c[j - 32] >> 4;
                        high += w * xq[j];
                        low += w * xq[PAIR + j];
                    }
                    const float s = float_of_fp16(scale[o * groups + 2 * p + lane % 2]);
                    acc[lane] = fmaf((float)(high * 256 + low) * steps[p * LANES + lane], s, acc[lane]);
                }
            }
            float total = 0.0f;
            for (int64_t lane = 0; lane < LANES; lane++) total += acc[lane];
            for (int64_t g = 0; g < groups; g++) total += float_of_fp16(minimum[o * groups + g]) * sums[g];
            y[r * N + o] = total;
        }
    }
    free(xc);
    free(steps);
    free(sums);
    return failed ? KERNELS_NO_MEMORY : KERNELS_OK;
}

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

// ---- int4 ---------------------------------------------------------------------------------------

// Short rows (a few cache lines each) give the hardware prefetcher no stream to learn: a tile of T
// output rows fetches the rows PREFETCH_ROWS ahead while it multiplies its own, their scales once,
// their codes of pair p of columns with that pair.
static inline void prefetch_int4_scales(const uint16_t *scale, const uint16_t *minimum, int64_t T, int64_t o0,
                                        int64_t N, int64_t groups) {
    if (o0 + PREFETCH_ROWS + T > N) return;
    for (int64_t t = 0; t < T; t++) {
        _mm_prefetch((const char *)(scale + (o0 + PREFETCH_ROWS + t) * groups), _MM_HINT_T0);
        _mm_prefetch((const char *)(minimum + (o0 + PREFETCH_ROWS + t) * groups), _MM_HINT_T0);
    }
}

static inline void prefetch_int4_codes(const uint8_t *codes, int64_t T, int64_t o0, int64_t N, int64_t K, int64_t p) {
    if (o0 + PREFETCH_ROWS + T > N) return;
    for (int64_t t = 0; t < T; t++)
        _mm_prefetch((const char *)(codes + (o0 + PREFETCH_ROWS + t) * (K / 2) + p * 32), _MM_HINT_T0);
}

#if defined(KERNELS_AVX512)
// prepare_int4_row_plain in 512-bit registers (the same codes; the sums added in another order).
static void prepare_int4_row(const float *x, int64_t K, int8_t *codes, float *steps, float *sums) {
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
                const __m512 v = _mm512_mul_ps(halves[i], inverse);
                const __m512 rounded = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                h[i] = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(rounded));
                l[i] = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(v, rounded), scale_low)));
            }
            high[g] = _mm256_set_m128i(h[1], h[0]);
            low[g] = _mm256_set_m128i(l[1], l[0]);
        }
        int8_t *out = codes + p * PAIR_CODES;
        _mm512_storeu_si512((void *)out, _mm512_permutex2var_epi32(_mm512_castsi256_si512(high[0]), interleave, _mm512_castsi256_si512(high[1])));
        _mm512_storeu_si512((void *)(out + PAIR), _mm512_permutex2var_epi32(_mm512_castsi256_si512(low[0]), interleave, _mm512_castsi256_si512(low[1])));
        const float s0 = step[0] / 256.0f, s1 = step[1] / 256.0f;
        _mm512_storeu_ps(steps + p * LANES, _mm512_set_ps(s1, s0, s1, s0, s1, s0, s1, s0, s1, s0, s1, s0, s1, s0, s1, s0));
    }
}

// T output rows against R rows of x, both compile-time constants (always inlined with literals),
// so that the T * R accumulators stay in registers.
static inline __attribute__((always_inline)) void int4_tile(
    const int64_t T, const int64_t R, int64_t K, const uint8_t *codes, const uint16_t *scale,
    const uint16_t *minimum, int64_t o0, int64_t N, float *y, const int8_t *xcodes, const float *xsteps,
    const float *xsums) {
    const int64_t pairs = K / PAIR, groups = K / GROUP, padded = (groups + 15) / 16 * 16;
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    __m512 acc[MAX_TILE][MAX_ROWS];
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < R; r++) acc[t][r] = _mm512_setzero_ps();
    prefetch_int4_scales(scale, minimum, T, o0, N, groups);
    for (int64_t p = 0; p < pairs; p++) {
        prefetch_int4_codes(codes, T, o0, N, K, p);
        for (int64_t t = 0; t < T; t++) {
            const int64_t o = o0 + t;
            const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + o * (K / 2) + p * 32));
            const __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
            const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            uint32_t pair_scales;
            memcpy(&pair_scales, scale + o * groups + 2 * p, sizeof pair_scales);
            const __m512 s = _mm512_cvtph_ps(_mm256_set1_epi32((int)pair_scales));
            for (int64_t r = 0; r < R; r++) {
                const int8_t *xq = xcodes + (r * pairs + p) * PAIR_CODES;
                const __m512i high = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512((const void *)xq));
                const __m512i low = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512((const void *)(xq + PAIR)));
                // |high| <= 4 * 15 * 128 per lane: shifted by 8 bits it stays far inside int32.
                const __m512i digits = _mm512_add_epi32(_mm512_slli_epi32(high, 8), low);
                const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(digits), _mm512_loadu_ps(xsteps + (r * pairs + p) * LANES));
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
#else
// 32 int32 (four registers, in order) to int8 with signed saturation, in order.
static inline __m256i saturate_to_int8(const __m256i q[4]) {
    // The packs work within 128-bit halves: each half ends up holding four values of each register.
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline float max256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// prepare_int4_row_plain in 256-bit registers (the same codes; the sums added in another order).
static void prepare_int4_row(const float *x, int64_t K, int8_t *codes, float *steps, float *sums) {
    const __m256 sign = _mm256_set1_ps(-0.0f), scale_low = _mm256_set1_ps(256.0f);
    for (int64_t p = 0; p < K / PAIR; p++) {
        __m256i high[2], low[2];
        for (int64_t g = 0; g < 2; g++) {
            const float *xg = x + p * PAIR + g * GROUP;
            __m256 v[4], amax = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(xg + 8 * i);
                amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
                sum = _mm256_add_ps(sum, v[i]);
            }
            const float top = max256(amax), step = top / 127.0f;
            sums[2 * p + g] = sum256(sum);
            const __m256 inverse = _mm256_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
            __m256i h[4], l[4];
            for (int i = 0; i < 4; i++) {
                const __m256 scaled = _mm256_mul_ps(v[i], inverse);
                const __m256 rounded = _mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                h[i] = _mm256_cvtps_epi32(rounded);
                l[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(scaled, rounded), scale_low));
            }
            high[g] = saturate_to_int8(h);
            low[g] = saturate_to_int8(l);
            for (int64_t lane = g; lane < LANES; lane += 2) steps[p * LANES + lane] = step / 256.0f;
        }
        // Group 0's and group 1's 4-byte chunks alternate in the weights' order (e(j) above).
        int8_t *out = codes + p * PAIR_CODES;
        const __m256i *digits[2] = {high, low};
        for (int d = 0; d < 2; d++) {
            const __m256i first = _mm256_unpacklo_epi32(digits[d][0], digits[d][1]);
            const __m256i second = _mm256_unpackhi_epi32(digits[d][0], digits[d][1]);
            _mm256_storeu_si256((__m256i *)(out + d * PAIR), _mm256_permute2x128_si256(first, second, 0x20));
            _mm256_storeu_si256((__m256i *)(out + d * PAIR + 32), _mm256_permute2x128_si256(first, second, 0x31));
        }
    }
}

// The 256-bit body: the low nibbles' and the high nibbles' registers have the same lanes' groups and
// x's steps, so their integer sums are added before the one conversion.
static inline __attribute__((always_inline)) void int4_tile(
    const int64_t T, const int64_t R, int64_t K, const uint8_t *codes, const uint16_t *scale,
    const uint16_t *minimum, int64_t o0, int64_t N, float *y, const int8_t *xcodes, const float *xsteps,
    const float *xsums) {
    const int64_t pairs = K / PAIR, groups = K / GROUP, padded = (groups + 15) / 16 * 16;
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    __m256 acc[MAX_TILE][MAX_ROWS];
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < R; r++) acc[t][r] = _mm256_setzero_ps();
    prefetch_int4_scales(scale, minimum, T, o0, N, groups);
    for (int64_t p = 0; p < pairs; p++) {
        prefetch_int4_codes(codes, T, o0, N, K, p);
        for (int64_t t = 0; t < T; t++) {
            const int64_t o = o0 + t;
            const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + o * (K / 2) + p * 32));
            const __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
            uint32_t pair_scales;
            memcpy(&pair_scales, scale + o * groups + 2 * p, sizeof pair_scales);
            const __m256 s = _mm256_cvtph_ps(_mm_set1_epi32((int)pair_scales));
            for (int64_t r = 0; r < R; r++) {
                const int8_t *xq = xcodes + (r * pairs + p) * PAIR_CODES;
                const __m256i *digits_of = (const __m256i *)xq;  // high digits (lo, hi halves), then low ones
                const __m256i high = dot2_u8s8(lo, _mm256_loadu_si256(digits_of), hi, _mm256_loadu_si256(digits_of + 1));
                const __m256i low = dot2_u8s8(lo, _mm256_loadu_si256(digits_of + 2), hi, _mm256_loadu_si256(digits_of + 3));
                const __m256i digits = _mm256_add_epi32(_mm256_slli_epi32(high, 8), low);
                const __m256 dot = _mm256_mul_ps(_mm256_cvtepi32_ps(digits), _mm256_loadu_ps(xsteps + (r * pairs + p) * LANES));
                acc[t][r] = _mm256_fmadd_ps(dot, s, acc[t][r]);
            }
        }
    }
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *m = minimum + (o0 + t) * groups;
        for (int64_t r = 0; r < R; r++) {
            const float *sums = xsums + r * padded;
            __m256 shift = _mm256_setzero_ps();
            int64_t g = 0;
            for (; g + 8 <= groups; g += 8)
                shift = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + g))), _mm256_loadu_ps(sums + g), shift);
            float total = sum256(_mm256_add_ps(acc[t][r], shift));
            for (; g < groups; g++) total += _cvtsh_ss(m[g]) * sums[g];
            y[r * N + o0 + t] = total;
        }
    }
}
#endif

#define INT4_TILE(R) ((R) == 1 ? ONE_ROW_TILE : OUT_TILE)
#define INT4_ROWS(R)                                                                                          \
    static void int4_rows_##R(int64_t K, const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum,  \
                              int64_t begin, int64_t end, int64_t N, float *y, const int8_t *xc,              \
                              const float *xs, const float *xsum) {                                           \
        int64_t o = begin;                                                                                    \
        for (; o + INT4_TILE(R) <= end; o += INT4_TILE(R))                                                    \
            int4_tile(INT4_TILE(R), R, K, codes, scale, minimum, o, N, y, xc, xs, xsum);                      \
        for (; o < end; o++) int4_tile(1, R, K, codes, scale, minimum, o, N, y, xc, xs, xsum);                \
    }
INT4_ROWS(1)
INT4_ROWS(2)
INT4_ROWS(3)
INT4_ROWS(4)

static int int4_block(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                      const uint16_t *minimum, int64_t N, float *y, int threads) {
    static _Thread_local Scratch scratch;
    const int64_t pairs = K / PAIR, groups = K / GROUP, padded = (groups + 15) / 16 * 16;
    const size_t code_bytes = round64((size_t)(rows * pairs * PAIR_CODES));
    const size_t step_bytes = round64(sizeof(float) * (size_t)(rows * pairs * LANES));
    char *buffer = scratch_reserve(&scratch, code_bytes + step_bytes + sizeof(float) * (size_t)(rows * padded));
    if (buffer == NULL) return KERNELS_NO_MEMORY;
    int8_t *xc = (int8_t *)buffer;
    float *xs = (float *)(buffer + code_bytes), *xsum = (float *)(buffer + code_bytes + step_bytes);
    memset(xsum, 0, sizeof(float) * (size_t)(rows * padded));  // the padding past the last group stays 0
    for (int64_t r = 0; r < rows; r++)
        prepare_int4_row(x + r * K, K, xc + r * pairs * PAIR_CODES, xs + r * pairs * LANES, xsum + r * padded);
    const int64_t tile = INT4_TILE(rows), tiles = (N + tile - 1) / tile;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t begin = t * tile, end = min64(begin + tile, N);
        switch (rows) {
            case 1: int4_rows_1(K, codes, scale, minimum, begin, end, N, y, xc, xs, xsum); break;
            case 2: int4_rows_2(K, codes, scale, minimum, begin, end, N, y, xc, xs, xsum); break;
            case 3: int4_rows_3(K, codes, scale, minimum, begin, end, N, y, xc, xs, xsum); break;
            default: int4_rows_4(K, codes, scale, minimum, begin, end, N, y, xc, xs, xsum); break;
        }
    }
    return KERNELS_OK;
}

// x: [rows, K] fp32 (K a multiple of 64), codes: [N, K / 2] in the layout above, scale and
// minimum: [N, K / 32] fp16, y: [rows, N] fp32.
int int4_matmul(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                const uint16_t *minimum, int64_t N, float *y, int threads) {
    if (K % PAIR) return KERNELS_BAD_SHAPE;
    for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS) {
        const int failed = int4_block(x + r0 * K, min64(MAX_ROWS, rows - r0), K, codes, scale, minimum, N, y + r0 * N, threads);
        if (failed) return failed;
    }
    return KERNELS_OK;
}

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

int int4_matmul(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                const uint16_t *minimum, int64_t N, float *y, int threads) {
    (void)threads;
    return int4_matmul_ref(x, rows, K, codes, scale, minimum, N, y);
}

int int8_matmul(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                float *y, int threads) {
    (void)threads;
    return int8_matmul_ref(x, rows, K, codes, scale, N, y);
}

#endif
