// The weight-only quantized products, at every row count: y[r, o] = sum_k x[r, k] * w[o, k], on the
// quantized weight itself, with integer dot products as llama.cpp does. Decode streams each weight
// once; prefill and large batches run the same loops as a GEMM.
//
// Both formats are stored in tiles of 16 output rows (kernels.h's Int4 and Int8), so that a register
// holds one 4-column piece of every row of a tile (16 lanes with AVX-512, 8 with 256-bit registers: a
// tile's two halves) and a thread reads its tiles as one sequential stream. Per tile and group of 32
// columns:
// - int4: 4 vectors of 16 rows x 4 bytes, byte b of vector i holding column 4i + b in its low nibble
//   and 16 + 4i + b in its high one (each row's 16 bytes are GGUF's Q4_0 / Q4_1 codes of that group);
//   the group's scales and minimums (fp16, per row) are stored apart: w = code * scale + minimum.
// - int8: 8 vectors of 16 rows x 4 bytes, byte b of vector i holding column 4i + b; one fp32 scale
//   per row, stored apart: w = code * scale.
//
// x is rounded once per group of 32 columns to one int8 digit (llama.cpp's Q8 activations), or, where
// the caller asks for `digits` = 2, to two, x / step ~ high + low / 256: 15 bits below the group's
// largest value, at twice the dot products (the engine asks for two in the LM head's product alone:
// layers/quant.py). A register tile computes one vector of output rows against up to GEMM_ROWS rows of
// x: a group's eight 4-column dot products per digit sum in int32 per lane (vpdpbusd, unsigned by
// signed: int8 codes go in offset by 128, taken back out with the digits' sum) before the one
// conversion that applies the group's step.
// With AVX2 alone: int4 codes by the digits in int16 pairs (vpmaddubsw), a group's summed in int16
// (at most 16 x 15 x 127), widened once per digit (vpmaddwd), more than GEMM_ROWS rows of x with one digit
// against both vectors of a tile at once (whole_tile, below); int8 codes widened to int16 and
// multiplied by both digits at once as one int16, q (below; vpmaddwd).
//
// Arithmetic, the same in the references and in every SIMD body, bit for bit, and for a row of x the
// same whatever other rows it comes with (a request computes the same alone as in a batch): per row of
// x and group g, v = x * (127 / max |x|), high = round(v), low = round(256 (v - high)) (both int8;
// low = 0 with one digit), x ~ step * q in units of the last digit: with one digit q = high and
// step = max |x| / 127, with two q = 256 high + low and step = max |x| / 127 / 256 (one digit's sums then
// need no shift); sum = step * (sum of q); then
// per output o, over the groups in order,
// - int4: acc = fma(dot(q, code), scale * step, acc); acc = fma(minimum, sum, acc); y = acc,
// - int8: acc = fma(dot(q, code), step, acc); y = acc * scale,
// the dequantized weight times the rounded x.
//
// Rows may also come rounded already, by the layer that computed them (int4_gemm_rounded, int8_gemm_rounded: the
// norms' and SwiGLU's rows, rounded by round_rows_of as they are computed, one digit): the same bits as
// rounding their fp32 rows here, without writing those out and reading them back.
//
// With the amx build, batches of more than GEMM_ROWS rows (which the vector bodies would read in more than
// one pass) sum each group's integer products on the tile unit instead (AMX-INT8, below): the same
// integers, then the same chains of fmas.
//
// Threads: the tiles are split over `threads` OpenMP threads, each a contiguous run of them; x is
// rounded once, row by row over them.

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

// The loops' blocking, by design from the cache sizes; prefill and decode speed with them:
// benchmarks.prefill_speed and benchmarks.decode_per_byte.
#define GEMM_ROWS 8    // rows of x per register tile
#define AMX_ROWS 16    // rows of x per tile product (the amx build's, below)
#define BLOCK_TILES 8  // tiles a register tile of x runs against while in L1 (their span's codes: L2)
#define SPAN 32        // groups per pass over the rows of x with plain AVX2: a register tile's x stays in L1
#define VNNI_SPAN 64   // the same with vpdpbusd (x is int8 alone there: 16 KiB a register tile); see gemm_rounded
#define TURN 8         // one row of x, 256-bit registers: groups a tile's first vector of rows runs before its second
// Bytes ahead in a tile's codes that the loop asks for (the stream's next 8-16 groups), and as many groups ahead
// in its scales and minimums: one row of x is bound by these streams (benchmarks.decode_per_byte; against other
// distances in the decode step: docs/benchmarks/session28-amd/fused_prefetch_ab.py).
#define PREFETCH 4096

const char *kernels_variant(void) { return KERNELS_VARIANT; }

// One row of x rounded per group (as above) to `digits` digits: q (high) and q_low [K] int8 (zeros with
// one digit), step and sum [K / 32].
typedef void (*RoundRow)(const float *x, int64_t K, int digits, int8_t *q, int8_t *q_low, float *step,
                         int32_t *totals, float *sum);

static void round_row_plain(const float *x, int64_t K, int digits, int8_t *q, int8_t *q_low, float *step,
                            int32_t *totals, float *sum) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        float amax = 0.0f;
        for (int64_t i = 0; i < GROUP; i++) amax = fmaxf(amax, fabsf(xg[i]));
        const float s = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t total = 0;  // of q
        for (int64_t i = 0; i < GROUP; i++) {
            const float v = xg[i] * inverse, high = nearbyintf(v);
            const float low = digits == 1 ? 0.0f : nearbyintf((v - high) * 256.0f);
            const int8_t h = (int8_t)(high > 127.0f ? 127.0f : high < -127.0f ? -127.0f : high);
            const int8_t l = (int8_t)(low > 127.0f ? 127.0f : low < -127.0f ? -127.0f : low);
            q[g * GROUP + i] = h;
            if (digits == 2) q_low[g * GROUP + i] = l;  // never read with one digit
            total += digits == 1 ? h : 256 * h + l;
        }
        step[g] = digits == 1 ? s : s / 256.0f;
        totals[g] = total;
        sum[g] = (float)total * step[g];
    }
}

// x [rows, K] rounded: high and low digits [rows, K], steps, digit totals and sums [rows, K / 32], in
// one buffer (round_rows), or where the layer that computed x rounded it (rounded_rows: one digit, low NULL).
typedef struct {
    int8_t *codes, *low;
    float *step, *sum;
    int32_t *total;
    int16_t *wide;  // the int8 product's operand with AVX2 alone (widen_rows); NULL elsewhere
    float *block_step, *block_sum;  // the amx build's: step and sum by block of AMX_ROWS rows (block_steps)
} RoundedX;

static int round_rows(RoundRow round_row, const float *x, int digits, int64_t rows, int64_t K,
                      Scratch *scratch, RoundedX *out, int threads) {
    const int64_t groups = K / GROUP;
    // The digits' rows up to a multiple of AMX_ROWS: the amx build's tile loads read that many at a time (the
    // rows past the last give sums that are never read).
    const size_t code_bytes = round64((size_t)((rows + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS * K));
    const size_t step_bytes = round64(sizeof(float) * (size_t)(rows * groups));
    char *buffer = scratch_reserve(scratch, 2 * code_bytes + 3 * step_bytes);
    if (buffer == NULL) return KERNELS_NO_MEMORY;
    out->codes = (int8_t *)buffer;
    out->low = (int8_t *)(buffer + code_bytes);
    out->step = (float *)(buffer + 2 * code_bytes);
    out->sum = (float *)(buffer + 2 * code_bytes + step_bytes);
    out->total = (int32_t *)(buffer + 2 * code_bytes + 2 * step_bytes);
    out->wide = NULL;
    out->block_step = out->block_sum = NULL;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++)
        round_row(x + r * K, K, digits, out->codes + r * K, out->low + r * K,
                  out->step + r * groups, out->total + r * groups, out->sum + r * groups);
    return KERNELS_OK;
}

// x's rows as the layer that computed them rounded them (one digit): RoundedX without the low digits.
static RoundedX rounded_rows(const int8_t *codes, const float *step, const int32_t *total, const float *sum) {
    const RoundedX xr = {(int8_t *)codes, NULL, (float *)step, (float *)sum, (int32_t *)total, NULL, NULL, NULL};
    return xr;
}

// int4_gemm_ref's products of x rounded.
static void int4_products_ref(const RoundedX *xr, int digits, int64_t rows, int64_t K, const uint8_t *codes,
                              const uint16_t *scale, const uint16_t *minimum, int64_t N, float *y) {
    const int64_t groups = K / GROUP;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < N; o++) {
            float acc = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                int32_t high = 0, low = 0;
                for (int64_t c = 0; c < GROUP; c++) {
                    const int w = int4_code_at(codes, K, o, g * GROUP + c);
                    high += w * xr->codes[r * K + g * GROUP + c];
                    if (digits == 2) low += w * xr->low[r * K + g * GROUP + c];
                }
                const int32_t dot = digits == 1 ? high : high * 256 + low;
                const int64_t at = (o / TILE * groups + g) * TILE + o % TILE;
                acc = fmaf((float)dot, float_of_fp16(scale[at]) * xr->step[r * groups + g], acc);
                acc = fmaf(float_of_fp16(minimum[at]), xr->sum[r * groups + g], acc);
            }
            y[r * N + o] = acc;
        }
}

int int4_gemm_ref(const float *x, int digits, int64_t rows, int64_t K, const uint8_t *codes,
                  const uint16_t *scale, const uint16_t *minimum, int64_t N, float *y) {
    if (K % GROUP || (digits != 1 && digits != 2)) return KERNELS_BAD_SHAPE;
    Scratch scratch = {0};
    RoundedX xr;
    if (round_rows(round_row_plain, x, digits, rows, K, &scratch, &xr, 1)) return KERNELS_NO_MEMORY;
    int4_products_ref(&xr, digits, rows, K, codes, scale, minimum, N, y);
    free(scratch.data);
    return KERNELS_OK;
}

// int8_gemm_ref's products of x rounded.
static void int8_products_ref(const RoundedX *xr, int digits, int64_t rows, int64_t K, const int8_t *codes,
                              const float *scale, int64_t N, float *y) {
    const int64_t groups = K / GROUP;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < N; o++) {
            float acc = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                int32_t dot = 0;
                for (int64_t c = 0; c < GROUP; c++) {
                    const int64_t k = r * K + g * GROUP + c;
                    const int q = digits == 1 ? xr->codes[k] : 256 * xr->codes[k] + xr->low[k];
                    dot += int8_code_at(codes, K, o, g * GROUP + c) * q;
                }
                acc = fmaf((float)dot, xr->step[r * groups + g], acc);
            }
            y[r * N + o] = acc * scale[o];
        }
}

int int8_gemm_ref(const float *x, int digits, int64_t rows, int64_t K, const int8_t *codes,
                  const float *scale, int64_t N, float *y) {
    if (K % GROUP || (digits != 1 && digits != 2)) return KERNELS_BAD_SHAPE;
    Scratch scratch = {0};
    RoundedX xr;
    if (round_rows(round_row_plain, x, digits, rows, K, &scratch, &xr, 1)) return KERNELS_NO_MEMORY;
    int8_products_ref(&xr, digits, rows, K, codes, scale, N, y);
    free(scratch.data);
    return KERNELS_OK;
}

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)

#if defined(KERNELS_AVX512)
#define V 16
typedef __m512i VecI;
#define load_si(p) _mm512_loadu_si512((const void *)(p))
#define and_si _mm512_and_si512
#define xor_si _mm512_xor_si512
#define sub_32 _mm512_sub_epi32
#define srli_16 _mm512_srli_epi16
#define slli_32 _mm512_slli_epi32
#define add_32 _mm512_add_epi32
#define set1_8 _mm512_set1_epi8
#define set1_32 _mm512_set1_epi32
#define set1_ps _mm512_set1_ps
#define zero_ps _mm512_setzero_ps
#define zero_si _mm512_setzero_si512
#define mul_ps _mm512_mul_ps
#define fma_ps _mm512_fmadd_ps
#define cvt_ps _mm512_cvtepi32_ps
#define load_ps _mm512_loadu_ps
#define store_ps _mm512_storeu_ps
#define load_ph(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define max_ps _mm512_max_ps
#define min_ps _mm512_min_ps
#define sub_ps _mm512_sub_ps
#define abs_ps _mm512_abs_ps
#define round_ps(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define cvt_32 _mm512_cvtps_epi32
#define reduce_max_ps _mm512_reduce_max_ps
#define reduce_add_32 _mm512_reduce_add_epi32
#define store_8(p, v) _mm_storeu_si128((__m128i *)(p), _mm512_cvtepi32_epi8(v))  // 16 int32 in -127..127
#else
#define V 8
typedef __m256i VecI;
#define load_si(p) _mm256_loadu_si256((const __m256i *)(p))
#define and_si _mm256_and_si256
#define xor_si _mm256_xor_si256
#define sub_32 _mm256_sub_epi32
#define srli_16 _mm256_srli_epi16
#define slli_32 _mm256_slli_epi32
#define add_32 _mm256_add_epi32
#define set1_8 _mm256_set1_epi8
#define set1_32 _mm256_set1_epi32
#define set1_ps _mm256_set1_ps
#define zero_ps _mm256_setzero_ps
#define zero_si _mm256_setzero_si256
#define mul_ps _mm256_mul_ps
#define fma_ps _mm256_fmadd_ps
#define cvt_ps _mm256_cvtepi32_ps
#define load_ps _mm256_loadu_ps
#define store_ps _mm256_storeu_ps
#define load_ph(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define max_ps _mm256_max_ps
#define min_ps _mm256_min_ps
#define sub_ps _mm256_sub_ps
#define abs_ps(v) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v)
#define round_ps(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define cvt_32 _mm256_cvtps_epi32
static inline float reduce_max_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
static inline int32_t reduce_add_32(__m256i v) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
}
static inline void store_8(int8_t *p, __m256i v) {  // 8 int32 in -127..127, in order
    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packs_epi16(words, words));
}
#endif
#define PARTS (TILE / V)  // vectors of output rows per tile

// round_row_plain in vector registers: the same values. Four groups at a time share the reductions across
// lanes of their largest magnitudes and of their digits' totals (max4, sum4) and their divisions: one group's
// alone were a chain of shuffles and divisions longer than its arithmetic. The totals are summed as floats,
// exactly: at most 32 x 32,639 in magnitude, under 2^24.
static inline __attribute__((always_inline)) void round_groups(const int n, const float *x, int digits, int8_t *q,
                                                               int8_t *q_low, float *step, int32_t *totals,
                                                               float *sum) {
    enum { VECTORS = GROUP / V };
    const VecF low_scale = set1_ps(256.0f), top = set1_ps(127.0f), bottom = set1_ps(-127.0f);
    VecF part[4][VECTORS], m[4], total[4];
    for (int j = 0; j < n; j++) {
        m[j] = zero_ps();
        for (int i = 0; i < VECTORS; i++) {
            part[j][i] = load_ps(x + j * GROUP + V * i);
            m[j] = max_ps(m[j], abs_ps(part[j][i]));
        }
    }
    for (int j = n; j < 4; j++) m[j] = m[0];
    const __m128 amax = max4(m[0], m[1], m[2], m[3]);
    float inverse[4];  // 127 / amax, 0 where amax is 0
    _mm_storeu_ps(inverse, _mm_and_ps(_mm_cmpgt_ps(amax, _mm_setzero_ps()), _mm_div_ps(_mm_set1_ps(127.0f), amax)));
    for (int j = 0; j < n; j++) {
        const VecF times = set1_ps(inverse[j]);
        VecI digit_total = zero_si();
        for (int i = 0; i < VECTORS; i++) {
            const VecF v = mul_ps(part[j][i], times), high = round_ps(v);
            const VecI hi = cvt_32(min_ps(max_ps(high, bottom), top));
            store_8(q + j * GROUP + V * i, hi);
            if (digits == 1) {
                digit_total = add_32(digit_total, hi);
            } else {
                const VecF low = round_ps(mul_ps(sub_ps(v, high), low_scale));
                const VecI lo = cvt_32(min_ps(max_ps(low, bottom), top));
                store_8(q_low + j * GROUP + V * i, lo);
                digit_total = add_32(digit_total, add_32(slli_32(hi, 8), lo));
            }
        }
        total[j] = cvt_ps(digit_total);
    }
    for (int j = n; j < 4; j++) total[j] = total[0];
    const __m128 s = _mm_div_ps(amax, _mm_set1_ps(127.0f));
    const __m128 steps = digits == 1 ? s : _mm_div_ps(s, _mm_set1_ps(256.0f));
    const __m128 sums = sum4(total[0], total[1], total[2], total[3]);
    float step_lanes[4], sum_lanes[4];
    int32_t total_lanes[4];
    _mm_storeu_ps(step_lanes, steps);
    _mm_storeu_ps(sum_lanes, _mm_mul_ps(sums, steps));
    _mm_storeu_si128((__m128i *)total_lanes, _mm_cvtps_epi32(sums));
    for (int j = 0; j < n; j++) step[j] = step_lanes[j], totals[j] = total_lanes[j], sum[j] = sum_lanes[j];
}

static void round_row_simd(const float *x, int64_t K, int digits, int8_t *q, int8_t *q_low, float *step,
                           int32_t *totals, float *sum) {
    const int64_t groups = K / GROUP;
    int64_t g = 0;
    for (; g + 4 <= groups; g += 4)
        round_groups(4, x + g * GROUP, digits, q + g * GROUP, q_low + g * GROUP, step + g, totals + g, sum + g);
    for (; g < groups; g++)
        round_groups(1, x + g * GROUP, digits, q + g * GROUP, q_low + g * GROUP, step + g, totals + g, sum + g);
}

static inline int32_t quad_of(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, sizeof v);
    return v;
}

// Where one vector of output rows is: part `part` of tile `tile`.
typedef struct {
    const uint8_t *codes;             // its group 0's first vector; a group further is 4 * BITS * TILE bytes on
    const uint16_t *scale, *minimum;  // int4: its group 0's; a group further is TILE values on
    const float *row_scale;           // int8: its rows'
    int64_t o0, live;                 // its first output row, and how many of its lanes are rows (the rest pad)
} Rows;

static inline Rows rows_of(int bits, const void *codes, const void *scale, const uint16_t *minimum, int64_t groups,
                           int64_t N, int64_t tile, int64_t part) {
    const int64_t o0 = tile * TILE + part * V, at = tile * groups * TILE + part * V;
    Rows rows = {(const uint8_t *)codes + tile * groups * 4 * bits * TILE + part * V * 4, NULL, NULL, NULL, o0,
                 min64(V, N - o0)};
    if (bits == 4) {
        rows.scale = (const uint16_t *)scale + at;
        rows.minimum = minimum + at;
    } else {
        rows.row_scale = (const float *)scale + o0;
    }
    return rows;
}

// A vector of outputs at y of which `live` lanes are rows: read with the pad as zeros, written without it.
static inline VecF load_outputs(const float *y, int64_t live) {
    if (live == V) return load_ps(y);
    float lanes[V] = {0};
    memcpy(lanes, y, sizeof(float) * (size_t)live);
    return load_ps(lanes);
}

static inline void store_outputs(float *y, int64_t live, VecF v) {
    if (live == V) {
        store_ps(y, v);
        return;
    }
    float lanes[V];
    store_ps(lanes, v);
    memcpy(y, lanes, sizeof(float) * (size_t)live);
}

// Block b's tiles of `blocks` over `tiles` tiles, [*t0, *t1): the blocks differ by one tile at most, so that threads
// given as many blocks each get as many tiles, give or take one a block.
static inline void tiles_of_block(int64_t b, int64_t blocks, int64_t tiles, int64_t *t0, int64_t *t1) {
    *t0 = b * tiles / blocks, *t1 = (b + 1) * tiles / blocks;
}

// acc + per lane the sum of the four u8 x s8 products of u and the 4 bytes at q, broadcast (vpdpbusd).
// Signed int8 codes go in offset by 128, the offset times the digits' sum taken back out after.
#if defined(KERNELS_AVX512)
// The broadcast is the instruction's own ({1to16}): for _mm512_dpbusd_epi32(acc, u, set1_32(...)) the
// compilers emit a vpbroadcastd apart, an issue slot per product (benchmarks.many_rows).
static inline __m512i dpbusd_at(__m512i acc, __m512i u, const int8_t *q) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int8_t(*)[4])q));
    return acc;
}
#elif defined(KERNELS_AVXVNNI)
static inline __m256i dpbusd_at(__m256i acc, __m256i u, const int8_t *q) {
    return _mm256_dpbusd_avx_epi32(acc, u, set1_32(quad_of(q)));  // VEX: no embedded broadcast
}
#else
#define WIDE_DOTS 1  // plain AVX2: the int16 products described at the top
#endif

// Whether gemm_tile takes a group's int4 products for all its rows of x before their fmas. With 16 registers
// (plain AVX2) a row's products and fmas in turn are one long chain, and the core's scheduler held too few
// rows' chains at once to keep its two multiply pipes busy; the int8 product gained nothing so. The other
// builds are untried (docs/benchmarks/session49-amd/notes.md).
#if defined(WIDE_DOTS)
#define PRODUCTS_FIRST 1
#else
#define PRODUCTS_FIRST 0
#endif

#if defined(WIDE_DOTS)
// x's rows as one int16 per column, q: the int8 product's other operand.
static int widen_rows(RoundedX *x, int digits, int64_t rows, int64_t K, Scratch *scratch, int threads) {
    x->wide = scratch_reserve(scratch, sizeof(int16_t) * (size_t)(rows * K));
    if (x->wide == NULL) return KERNELS_NO_MEMORY;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = r * K; k < (r + 1) * K; k++)
            x->wide[k] = (int16_t)(digits == 1 ? x->codes[k] : 256 * x->codes[k] + x->low[k]);
    return KERNELS_OK;
}

// Per lane the sum of a group's products with one digit: its 8 pieces' summed in int16 pairs (at most
// 8 x 2 x 15 x 127), then widened, times `weight` (256 for the high digit, 1 for the low).
static inline __m256i int4_digit_dot(const __m256i *quads, const int8_t *q, __m256i weight) {
    __m256i pairs = _mm256_maddubs_epi16(quads[0], _mm256_set1_epi32(quad_of(q)));
    for (int i = 1; i < 8; i++)
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(quads[i], _mm256_set1_epi32(quad_of(q + 4 * i))));
    return _mm256_madd_epi16(pairs, weight);
}
#endif

// Row `at`'s (column `column` of x's rows) integer products with one group of a vector of BITS-bit output rows,
// its pieces in `quads` (gemm_tile's), per lane: the exact sum of the group's DIGITS-digit products.
static inline __attribute__((always_inline)) VecI group_dot(const int BITS, const int DIGITS, const VecI *quads,
                                                            const RoundedX *x, int64_t column, int64_t at) {
#if defined(WIDE_DOTS)
    (void)at;
    if (BITS == 4) {
        VecI dot = int4_digit_dot(quads, x->codes + column, _mm256_set1_epi16(DIGITS == 1 ? 1 : 256));
        if (DIGITS == 2) dot = add_32(dot, int4_digit_dot(quads, x->low + column, _mm256_set1_epi16(1)));
        return dot;
    }
    // x->wide holds both digits (the low ones zero with one): one product either way. Per lane pairs of one
    // row's column sums (rows 0-3, rows 4-7), then one sum per row in order.
    __m256i first = zero_si(), second = zero_si();
    for (int i = 0; i < 8; i++) {
        int64_t four;  // columns 4i .. 4i + 3 of x
        memcpy(&four, x->wide + column + 4 * i, sizeof four);
        const __m256i xs = _mm256_set1_epi64x(four);
        first = add_32(first, _mm256_madd_epi16(quads[2 * i], xs));
        second = add_32(second, _mm256_madd_epi16(quads[2 * i + 1], xs));
    }
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(first, second), 0xD8);
#else
    VecI digit[2];
    for (int d = 0; d < DIGITS; d++) {
        const int8_t *q = (d ? x->low : x->codes) + column;
        // Two chains of vpdpbusd, each half as long: many rows of x are bound by its latency.
        VecI even = zero_si(), odd = zero_si();
        for (int i = 0; i < 8; i += 2) {
            even = dpbusd_at(even, quads[i], q + 4 * i);
            odd = dpbusd_at(odd, quads[i + 1], q + 4 * i + 4);
        }
        digit[d] = add_32(even, odd);
    }
    const VecI dot = DIGITS == 1 ? digit[0] : add_32(slli_32(digit[0], 8), digit[1]);
    return BITS == 8 ? sub_32(dot, set1_32(128 * x->total[at])) : dot;
#endif
}

// acc with row `at`'s group `dot` (group_dot's) taken in: int4 by the group's scales `s` and minimums `m`.
static inline __attribute__((always_inline)) VecF group_sum(const int BITS, VecF acc, VecI dot, VecF s, VecF m,
                                                            const RoundedX *x, int64_t at) {
    if (BITS == 8) return fma_ps(cvt_ps(dot), set1_ps(x->step[at]), acc);
    acc = fma_ps(cvt_ps(dot), mul_ps(s, set1_ps(x->step[at])), acc);
    return fma_ps(m, set1_ps(x->sum[at]), acc);
}

// R rows of x from r0 against one vector of BITS-bit output rows, with DIGITS digits of x (all three
// compile-time constants: always inlined with literals), over groups g0 .. g1:
// the sums go on from y's where g0 > 0 (the same chain of fmas as in one pass).
static inline __attribute__((always_inline)) void gemm_tile(const int64_t R, const int BITS, const int DIGITS,
                                                            int64_t K, const Rows *w, const RoundedX *x, int64_t r0,
                                                            int64_t g0, int64_t g1, int64_t N, float *y) {
    const int64_t groups = K / GROUP, group_bytes = 4 * BITS * TILE;
    const VecI nibble = set1_8(0x0F);
    VecF acc[GEMM_ROWS];
    // Every loop over the rows unrolled (8: GEMM_ROWS), so that acc[] stays in registers. Left to itself GCC
    // keeps the group loop's rows a loop, stores acc[] to the stack each group and spills the rows' addresses,
    // which costs most where the core issues vpdpbusd fastest (docs/benchmarks/session47-amd/unroll_ab.py).
    _Static_assert(GEMM_ROWS == 8, "gemm_tile's unroll pragmas name GEMM_ROWS");
#pragma GCC unroll 8
    for (int64_t r = 0; r < R; r++) acc[r] = g0 == 0 ? zero_ps() : load_outputs(y + (r0 + r) * N + w->o0, w->live);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *codes = w->codes + g * group_bytes;
        for (int64_t line = 0; line < group_bytes; line += 64)
            _mm_prefetch((const char *)(codes + PREFETCH + line), _MM_HINT_T0);
        if (BITS == 4) {  // the scales' and minimums' streams, as many groups ahead
            _mm_prefetch((const char *)(w->scale + (g + PREFETCH / group_bytes) * TILE), _MM_HINT_T0);
            _mm_prefetch((const char *)(w->minimum + (g + PREFETCH / group_bytes) * TILE), _MM_HINT_T0);
        }
        // int4: the 4 low-nibble pieces, then the 4 high-nibble ones; int8: its 8 pieces (offset by 128
        // for vpdpbusd), or with AVX2 alone each widened to int16: rows 0-3 of the vector, then 4-7.
        VecI quads[16];
        for (int64_t i = 0; i < BITS; i++) {
            const uint8_t *piece = codes + i * 4 * TILE;
            if (BITS == 4) {
                const VecI v = load_si(piece);
                quads[i] = and_si(v, nibble);
                quads[4 + i] = and_si(srli_16(v, 4), nibble);
            } else {
#if defined(WIDE_DOTS)
                quads[2 * i] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)piece));
                quads[2 * i + 1] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(piece + 16)));
#else
                quads[i] = xor_si(load_si(piece), set1_8((char)0x80));
#endif
            }
        }
        VecF s = zero_ps(), m = zero_ps();
        if (BITS == 4) {
            s = load_ph(w->scale + g * TILE);
            m = load_ph(w->minimum + g * TILE);
        }
        if (PRODUCTS_FIRST && BITS == 4) {
            VecI dots[GEMM_ROWS];
#pragma GCC unroll 8
            for (int64_t r = 0; r < R; r++)
                dots[r] = group_dot(BITS, DIGITS, quads, x, (r0 + r) * K + g * GROUP, (r0 + r) * groups + g);
#pragma GCC unroll 8
            for (int64_t r = 0; r < R; r++)
                acc[r] = group_sum(BITS, acc[r], dots[r], s, m, x, (r0 + r) * groups + g);
        } else {
#pragma GCC unroll 8
            for (int64_t r = 0; r < R; r++) {
                const int64_t at = (r0 + r) * groups + g, column = (r0 + r) * K + g * GROUP;
                acc[r] = group_sum(BITS, acc[r], group_dot(BITS, DIGITS, quads, x, column, at), s, m, x, at);
            }
        }
    }
    // int8's row scales, once the last group is in (a tile's are padded with zeros: V of them are there).
    const VecF row_scale = BITS == 8 && g1 == groups ? load_ps(w->row_scale) : zero_ps();
#pragma GCC unroll 8
    for (int64_t r = 0; r < R; r++) {
        if (BITS == 8 && g1 == groups) acc[r] = mul_ps(acc[r], row_scale);
        store_outputs(y + (r0 + r) * N + w->o0, w->live, acc[r]);
    }
}

typedef void (*TileFn)(int64_t, const Rows *, const RoundedX *, int64_t, int64_t, int64_t, int64_t, float *);
#define GEMM_TILE(R, BITS, DIGITS)                                                                         \
    static void gemm_tile_##R##_##BITS##_##DIGITS(int64_t K, const Rows *w, const RoundedX *x, int64_t r0,     \
                                                  int64_t g0, int64_t g1, int64_t N, float *y) {            \
        gemm_tile(R, BITS, DIGITS, K, w, x, r0, g0, g1, N, y);                                                \
    }
#define GEMM_TILES(BITS, DIGITS)                                                                              \
    GEMM_TILE(1, BITS, DIGITS)                                                                                \
    GEMM_TILE(2, BITS, DIGITS)                                                                                \
    GEMM_TILE(3, BITS, DIGITS)                                                                                \
    GEMM_TILE(4, BITS, DIGITS)                                                                                \
    GEMM_TILE(5, BITS, DIGITS)                                                                                \
    GEMM_TILE(6, BITS, DIGITS)                                                                                \
    GEMM_TILE(7, BITS, DIGITS)                                                                                \
    GEMM_TILE(8, BITS, DIGITS)                                                                                \
    static const TileFn gemm_tiles_##BITS##_##DIGITS[GEMM_ROWS + 1] = {                                       \
        NULL, gemm_tile_1_##BITS##_##DIGITS, gemm_tile_2_##BITS##_##DIGITS, gemm_tile_3_##BITS##_##DIGITS,     \
        gemm_tile_4_##BITS##_##DIGITS, gemm_tile_5_##BITS##_##DIGITS, gemm_tile_6_##BITS##_##DIGITS,           \
        gemm_tile_7_##BITS##_##DIGITS, gemm_tile_8_##BITS##_##DIGITS};
GEMM_TILES(4, 1)
GEMM_TILES(4, 2)
GEMM_TILES(8, 1)
GEMM_TILES(8, 2)

#if defined(WIDE_DOTS)
// Plain AVX2, int4 codes with one digit, more than GEMM_ROWS rows of x (gemm_unpacked): per block and span, its
// tiles' codes are unpacked to bytes once (unpack_codes), and whole_tile runs WHOLE_ROWS rows of x against both
// vectors of a tile at once, each broadcast of x's 4 bytes serving both. gemm_tile broadcasts x for each vector and
// unpacks the nibbles for each register tile: a third of its loop's vector uops
// (docs/benchmarks/session51-amd/notes.md).
#define WHOLE_ROWS 4  // rows of x per whole_tile: their 8 int16 sums, 2 unpacked vectors and x's broadcast in registers
#define UNPACKED 16   // vectors per group of a tile unpacked: per piece i < 4, its low nibbles (columns 4i ..) for
                      // both vectors of rows, then its high ones (columns 16 + 4i ..)

// The codes of a tile's two vectors of rows `w` over groups g0 .. g1 as bytes, UNPACKED vectors a group.
static void unpack_codes(const Rows w[2], int64_t g0, int64_t g1, VecI *out) {
    const int64_t group_bytes = 4 * 4 * TILE;
    const VecI nibble = set1_8(0x0F);
    for (int64_t g = g0; g < g1; g++, out += UNPACKED)
        for (int64_t i = 0; i < 4; i++)
            for (int h = 0; h < 2; h++) {
                const VecI v = load_si(w[h].codes + g * group_bytes + i * 4 * TILE);
                out[4 * i + h] = and_si(v, nibble);
                out[4 * i + 2 + h] = and_si(srli_16(v, 4), nibble);
            }
}

// R rows of x (at most WHOLE_ROWS, a compile-time constant) from r0 against a tile's two vectors of rows `w`, over
// groups g0 .. g1 of its codes unpacked from g0 on (`unpacked`): each vector's sums as gemm_tile's, the same bits.
static inline __attribute__((always_inline)) void whole_tile(const int64_t R, int64_t K, const Rows w[2],
                                                             const VecI *unpacked, const RoundedX *x, int64_t r0,
                                                             int64_t g0, int64_t g1, int64_t N, float *y) {
    const int64_t groups = K / GROUP;
    const VecI ones = _mm256_set1_epi16(1);
    VecF acc[WHOLE_ROWS][2];
#pragma GCC unroll 4
    for (int64_t r = 0; r < R; r++)
        for (int h = 0; h < 2; h++)
            acc[r][h] = g0 == 0 || w[h].live <= 0 ? zero_ps() : load_outputs(y + (r0 + r) * N + w[h].o0, w[h].live);
    for (int64_t g = g0; g < g1; g++, unpacked += UNPACKED) {
        VecI sums[WHOLE_ROWS][2];  // int16 pairs, as int4_digit_dot's
#pragma GCC unroll 4
        for (int64_t r = 0; r < R; r++) sums[r][0] = sums[r][1] = zero_si();
#pragma GCC unroll 8
        for (int64_t piece = 0; piece < 8; piece++) {  // columns 4 piece on: the low nibbles, then the high ones
            const int64_t i = piece % 4, high = piece / 4;
            const VecI codes0 = load_si(unpacked + 4 * i + 2 * high), codes1 = load_si(unpacked + 4 * i + 2 * high + 1);
#pragma GCC unroll 4
            for (int64_t r = 0; r < R; r++) {
                const VecI xs = set1_32(quad_of(x->codes + (r0 + r) * K + g * GROUP + 4 * piece));
                sums[r][0] = _mm256_add_epi16(sums[r][0], _mm256_maddubs_epi16(codes0, xs));
                sums[r][1] = _mm256_add_epi16(sums[r][1], _mm256_maddubs_epi16(codes1, xs));
                // Each sum one chain: GCC otherwise takes all 64 products first and spills them to the stack.
                __asm__("" : "+x"(sums[r][0]), "+x"(sums[r][1]));
            }
        }
        for (int h = 0; h < 2; h++) {
            const VecF s = load_ph(w[h].scale + g * TILE), m = load_ph(w[h].minimum + g * TILE);
#pragma GCC unroll 4
            for (int64_t r = 0; r < R; r++) {
                const VecI dot = _mm256_madd_epi16(sums[r][h], ones);
                acc[r][h] = group_sum(4, acc[r][h], dot, s, m, x, (r0 + r) * groups + g);
            }
        }
    }
#pragma GCC unroll 4
    for (int64_t r = 0; r < R; r++)
        for (int h = 0; h < 2; h++)
            if (w[h].live > 0) store_outputs(y + (r0 + r) * N + w[h].o0, w[h].live, acc[r][h]);
}

typedef void (*WholeTileFn)(int64_t, const Rows *, const VecI *, const RoundedX *, int64_t, int64_t, int64_t, int64_t,
                            float *);
#define WHOLE_TILE(R)                                                                                          \
    static void whole_tile_##R(int64_t K, const Rows *w, const VecI *unpacked, const RoundedX *x, int64_t r0, \
                               int64_t g0, int64_t g1, int64_t N, float *y) {                                  \
        whole_tile(R, K, w, unpacked, x, r0, g0, g1, N, y);                                                    \
    }
WHOLE_TILE(1)
WHOLE_TILE(2)
WHOLE_TILE(3)
WHOLE_TILE(4)
static const WholeTileFn whole_tiles[WHOLE_ROWS + 1] = {NULL, whole_tile_1, whole_tile_2, whole_tile_3, whole_tile_4};

// gemm_rounded's many rows for int4 codes with one digit (above): the blocks split over the threads as there.
static int gemm_unpacked(const RoundedX *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                         const uint16_t *minimum, int64_t N, float *y, int64_t blocks, int threads) {
    const int64_t groups = K / GROUP, tiles = (N + TILE - 1) / TILE;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        static _Thread_local Scratch scratch;  // a block's span of codes unpacked
        VecI *unpacked = team_reserve(&scratch, sizeof(VecI) * UNPACKED * BLOCK_TILES * SPAN, &failed);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            if (unpacked == NULL) continue;
            int64_t t0, t1;
            tiles_of_block(b, blocks, tiles, &t0, &t1);
            Rows w[BLOCK_TILES][2];  // each tile's two vectors of rows
            for (int64_t t = t0; t < t1; t++)
                for (int h = 0; h < 2; h++) w[t - t0][h] = rows_of(4, codes, scale, minimum, groups, N, t, h);
            for (int64_t g0 = 0; g0 < groups; g0 += SPAN) {
                const int64_t g1 = min64(g0 + SPAN, groups);
                for (int64_t t = 0; t < t1 - t0; t++) unpack_codes(w[t], g0, g1, unpacked + t * UNPACKED * SPAN);
                for (int64_t r0 = 0; r0 < rows; r0 += WHOLE_ROWS)
                    for (int64_t t = 0; t < t1 - t0; t++)
                        whole_tiles[min64(WHOLE_ROWS, rows - r0)](K, w[t], unpacked + t * UNPACKED * SPAN, x, r0, g0,
                                                                  g1, N, y);
            }
        }
    }
    return failed ? KERNELS_NO_MEMORY : KERNELS_OK;
}
#endif

#if defined(KERNELS_AMX)
// Batches of more than GEMM_ROWS rows on the tile unit (AMX-INT8): per tile of 16 outputs, block of 16 rows
// of x and group, one tile product sums the group's integer dot products (x's digits by the codes, 16 x 16
// int32), and the vector registers take those sums through gemm_tile's chain of fmas per output. The integer
// sums are exact, so the outputs are gemm_tile's bit for bit: a row's outputs do not depend on how many rows
// came with it. From 9 rows on, where the vector bodies read the codes twice, this is faster (below 9 the
// tile side costs more than it saves): docs/benchmarks/session33-spr/amx_decode_ab.py.
// The int8 codes are stored in the tile instruction's layout (8 tile rows of 16 outputs x 4 columns); the
// int4 ones are too once unpacked to bytes, which is done UNPACK_AHEAD groups before their tile load (a tile
// load of bytes that vector stores wrote just before waits for those stores). Tile registers: 0-3 the sums of
// the groups in flight (4 groups, or 2 pairs with two digits), 4-5 x's digits, 6-7 the codes.
#define UNPACK_AHEAD 4
#define UNPACK_RING 8  // unpacked groups' buffers, a power of two above UNPACK_AHEAD
_Static_assert(PARTS == 1, "a tile of output rows is one vector of the amx build");
#define UNPACKED_BYTES (8 * 4 * TILE)

// x's steps and sums per block of AMX_ROWS rows and group, the block's rows together ([blocks, groups,
// AMX_ROWS], zeros past the last row): the vector side's loads of a group's 16 then lie at fixed offsets
// from one address, where rows of x take a register each.
static int block_steps(RoundedX *x, int64_t rows, int64_t K, Scratch *scratch) {
    const int64_t groups = K / GROUP, padded = (rows + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS;
    float *block = scratch_reserve(scratch, sizeof(float) * (size_t)(2 * padded * groups));
    if (block == NULL) return KERNELS_NO_MEMORY;
    x->block_step = block, x->block_sum = block + padded * groups;
    for (int64_t r = 0; r < padded; r++)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t at = (r / AMX_ROWS * groups + g) * AMX_ROWS + r % AMX_ROWS;
            x->block_step[at] = r < rows ? x->step[r * groups + g] : 0.0f;
            x->block_sum[at] = r < rows ? x->sum[r * groups + g] : 0.0f;
        }
    return KERNELS_OK;
}

static void amx_int_configure(void) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 4; t++) c.rows[t] = AMX_ROWS, c.columns[t] = 4 * TILE;  // sums: 16 rows x 16 int32
    for (int t = 4; t < 6; t++) c.rows[t] = AMX_ROWS, c.columns[t] = GROUP;     // a group of x's digits
    for (int t = 6; t < 8; t++) c.rows[t] = GROUP / 4, c.columns[t] = 4 * TILE;  // codes: 8 x 16 outputs x 4
    load_tile_config(&c);
}

// A group's int4 codes (rows_of's layout) as bytes in the tile layout: the 4 low-nibble pieces (columns
// 0-15), then the 4 high-nibble ones.
static inline void unpack_group(const uint8_t *codes, uint8_t *out) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    for (int i = 0; i < 4; i++) {
        const __m512i v = _mm512_loadu_si512(codes + i * 4 * TILE);
        _mm512_store_si512(out + i * 4 * TILE, _mm512_and_si512(v, nibble));
        _mm512_store_si512(out + (4 + i) * 4 * TILE, _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
    }
}

// A group's tile products: x's digits (tile A, and AL for the low digit) by the codes (tile B) into the sums
// tiles C (and CL). The tile numbers are literals.
#define AMX_PRODUCT(BITS, DIGITS, A, AL, B, C, CL, xa, xl, K, codes) \
    do {                                                             \
        _tile_loadd(B, codes, 4 * TILE);                             \
        _tile_loadd(A, xa, K);                                       \
        _tile_zero(C);                                               \
        if (BITS == 4)                                               \
            _tile_dpbsud(C, A, B);                                   \
        else                                                         \
            _tile_dpbssd(C, A, B);                                   \
        if (DIGITS == 2) {                                           \
            _tile_loadd(AL, xl, K);                                  \
            _tile_zero(CL);                                          \
            if (BITS == 4)                                           \
                _tile_dpbsud(CL, AL, B);                             \
            else                                                     \
                _tile_dpbssd(CL, AL, B);                             \
        }                                                            \
    } while (0)

// A group's sums from tiles C (and CL) to memory, a tile a run of AMX_ROWS x TILE int32.
#define AMX_STORE(DIGITS, C, CL, sums)                                              \
    do {                                                                            \
        _tile_stored(C, sums, 4 * TILE);                                            \
        if (DIGITS == 2) _tile_stored(CL, (sums) + AMX_ROWS * TILE, 4 * TILE);      \
    } while (0)

// The tile unit runs its instructions in order, so a group's sums go to memory a group after its product (a
// store right after it would hold the next products back until the product is done), and the vector side
// takes them AMX_LAG groups after the product. Memory holds 4 groups' sums.
#define AMX_LAG 3

// R rows of x from r0 (R <= AMX_ROWS) against one tile of output rows, all groups; `ring` holds
// UNPACK_RING unpacked groups, `sums` 4 groups' sums of each digit.
static inline __attribute__((always_inline)) void amx_tile(const int BITS, const int DIGITS, int64_t R, int64_t K,
                                                           const Rows *w, const RoundedX *x, int64_t r0, int64_t N,
                                                           float *y, uint8_t *ring, int32_t *sums) {
    const int64_t groups = K / GROUP, group_bytes = 4 * BITS * TILE, group_sums = DIGITS * AMX_ROWS * TILE;
    VecF acc[AMX_ROWS];
#pragma GCC unroll 16
    for (int64_t r = 0; r < R; r++) acc[r] = zero_ps();
    if (BITS == 4)
        for (int64_t u = 0; u < UNPACK_AHEAD && u < groups; u++)
            unpack_group(w->codes + u * group_bytes, ring + u % UNPACK_RING * UNPACKED_BYTES);
    for (int64_t g = 0; g < groups + AMX_LAG; g++) {
        if (g < groups) {
            const uint8_t *codes = w->codes + g * group_bytes;
            for (int64_t line = 0; line < group_bytes; line += 64)
                _mm_prefetch((const char *)(codes + PREFETCH + line), _MM_HINT_T0);
            if (BITS == 4) {
                if (g + UNPACK_AHEAD < groups)
                    unpack_group(codes + UNPACK_AHEAD * group_bytes,
                                 ring + (g + UNPACK_AHEAD) % UNPACK_RING * UNPACKED_BYTES);
                codes = ring + g % UNPACK_RING * UNPACKED_BYTES;
            }
            const int8_t *xa = x->codes + r0 * K + g * GROUP, *xl = DIGITS == 2 ? x->low + r0 * K + g * GROUP : NULL;
            // Sums tiles: 0-3 a group each with one digit, pairs 0-1 and 2-3 with two.
            if (DIGITS == 2) {
                if (g % 2 == 0) AMX_PRODUCT(BITS, 2, 4, 5, 6, 0, 1, xa, xl, K, codes);
                else AMX_PRODUCT(BITS, 2, 4, 5, 7, 2, 3, xa, xl, K, codes);
            } else {
                switch (g % 4) {
                    case 0: AMX_PRODUCT(BITS, 1, 4, 4, 6, 0, 0, xa, xl, K, codes); break;
                    case 1: AMX_PRODUCT(BITS, 1, 5, 5, 7, 1, 1, xa, xl, K, codes); break;
                    case 2: AMX_PRODUCT(BITS, 1, 4, 4, 6, 2, 2, xa, xl, K, codes); break;
                    default: AMX_PRODUCT(BITS, 1, 5, 5, 7, 3, 3, xa, xl, K, codes); break;
                }
            }
        }
        const int64_t stored = g - 1;
        if (stored >= 0 && stored < groups) {
            int32_t *to = sums + stored % 4 * group_sums;
            if (DIGITS == 2) {
                if (stored % 2 == 0) AMX_STORE(2, 0, 1, to);
                else AMX_STORE(2, 2, 3, to);
            } else {
                switch (stored % 4) {
                    case 0: AMX_STORE(1, 0, 0, to); break;
                    case 1: AMX_STORE(1, 1, 1, to); break;
                    case 2: AMX_STORE(1, 2, 2, to); break;
                    default: AMX_STORE(1, 3, 3, to); break;
                }
            }
        }
        const int64_t e = g - AMX_LAG;  // the group whose sums the vector side takes now
        if (e < 0) continue;
        const int32_t *high = sums + e % 4 * group_sums, *low = high + AMX_ROWS * TILE;
        VecF s = zero_ps(), m = zero_ps();
        if (BITS == 4) {
            s = load_ph(w->scale + e * TILE);
            m = load_ph(w->minimum + e * TILE);
        }
        const float *step = x->block_step + (r0 / AMX_ROWS * groups + e) * AMX_ROWS;
        const float *sum = x->block_sum + (r0 / AMX_ROWS * groups + e) * AMX_ROWS;
#pragma GCC unroll 16
        for (int64_t r = 0; r < R; r++) {
            VecI dot = load_si(high + r * TILE);
            if (DIGITS == 2) dot = add_32(slli_32(dot, 8), load_si(low + r * TILE));
            if (BITS == 4) {
                acc[r] = fma_ps(cvt_ps(dot), mul_ps(s, set1_ps(step[r])), acc[r]);
                acc[r] = fma_ps(m, set1_ps(sum[r]), acc[r]);
            } else {
                acc[r] = fma_ps(cvt_ps(dot), set1_ps(step[r]), acc[r]);
            }
        }
    }
    const VecF row_scale = BITS == 8 ? load_ps(w->row_scale) : zero_ps();
    float lanes[AMX_ROWS][V];
#pragma GCC unroll 16
    for (int64_t r = 0; r < R; r++) store_ps(lanes[r], BITS == 8 ? mul_ps(acc[r], row_scale) : acc[r]);
    for (int64_t r = 0; r < R; r++) memcpy(y + (r0 + r) * N + w->o0, lanes[r], sizeof(float) * (size_t)w->live);
}

typedef void (*AmxTileFn)(int64_t, int64_t, const Rows *, const RoundedX *, int64_t, int64_t, float *, uint8_t *,
                          int32_t *);
#define AMX_TILE(BITS, DIGITS)                                                                                   \
    static void amx_tile_##BITS##_##DIGITS(int64_t R, int64_t K, const Rows *w, const RoundedX *x, int64_t r0,  \
                                           int64_t N, float *y, uint8_t *ring, int32_t *sums) {                 \
        if (R == AMX_ROWS) /* a literal: the sums stay in registers */                                          \
            amx_tile(BITS, DIGITS, AMX_ROWS, K, w, x, r0, N, y, ring, sums);                                    \
        else                                                                                                    \
            amx_tile(BITS, DIGITS, R, K, w, x, r0, N, y, ring, sums);                                           \
    }
AMX_TILE(4, 1)
AMX_TILE(4, 2)
AMX_TILE(8, 1)
AMX_TILE(8, 2)

// Every row of x against every tile, the tiles in `blocks` blocks split over the threads (as gemm's):
// AMX_ROWS rows of x at a time, and a last block of at most GEMM_ROWS rows by the register tiles `vector`
// (the tile side would cost as much as for a full block).
static void amx_gemm(int bits, int digits, const RoundedX *x, int64_t rows, int64_t K, const void *codes,
                     const void *scale, const uint16_t *minimum, int64_t N, float *y, int64_t blocks,
                     const TileFn *vector, int threads) {
    const AmxTileFn run = digits == 1 ? (bits == 4 ? amx_tile_4_1 : amx_tile_8_1)
                                      : (bits == 4 ? amx_tile_4_2 : amx_tile_8_2);
    const int64_t tiles = (N + TILE - 1) / TILE;
#pragma omp parallel num_threads(threads)
    {
        uint8_t ring[UNPACK_RING * UNPACKED_BYTES] __attribute__((aligned(64)));
        int32_t sums[4 * 2 * AMX_ROWS * TILE] __attribute__((aligned(64)));  // 4 groups', of up to two digits
        amx_int_configure();
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t t0, t1;
            tiles_of_block(b, blocks, tiles, &t0, &t1);
            for (int64_t t = t0; t < t1; t++)
                for (int64_t r0 = 0; r0 < rows; r0 += AMX_ROWS) {
                    const Rows w = rows_of(bits, codes, scale, minimum, K / GROUP, N, t, 0);
                    const int64_t R = min64(AMX_ROWS, rows - r0);
                    if (R > GEMM_ROWS)
                        run(R, K, &w, x, r0, N, y, ring, sums);
                    else
                        vector[R](K, &w, x, r0, 0, K / GROUP, N, y);
                }
        }
        _tile_release();
    }
}
#endif

// Every row of x rounded against every tile of a BITS-bit weight (rows_of's codes, scale, minimum).
static int gemm_rounded(int bits, RoundedX xr, int digits, int64_t rows, int64_t K, const void *codes,
                        const void *scale, const uint16_t *minimum, int64_t N, float *y, int threads) {
#if defined(WIDE_DOTS)
    static _Thread_local Scratch wide_scratch;
    if (bits == 8 && widen_rows(&xr, digits, rows, K, &wide_scratch, threads)) return KERNELS_NO_MEMORY;
#endif
    const TileFn *run = digits == 1 ? (bits == 4 ? gemm_tiles_4_1 : gemm_tiles_8_1)
                                    : (bits == 4 ? gemm_tiles_4_2 : gemm_tiles_8_2);
    const int64_t groups = K / GROUP, tiles = (N + TILE - 1) / TILE;
    // Each register tile of x is run against a block of up to BLOCK_TILES tiles while it is in L1; the
    // blocks come in a multiple of the threads, so that each thread gets the same number.
    const int64_t blocks = threads * ((tiles + threads * BLOCK_TILES - 1) / (threads * BLOCK_TILES));
#if defined(KERNELS_AMX)
    if (rows > GEMM_ROWS) {
        static _Thread_local Scratch block_scratch;
        if (block_steps(&xr, rows, K, &block_scratch)) return KERNELS_NO_MEMORY;
        amx_gemm(bits, digits, &xr, rows, K, codes, scale, minimum, N, y, blocks, run, threads);
        return KERNELS_OK;
    }
#endif
    if (rows <= GEMM_ROWS) {
        // One register tile of x reads each code once: tile by tile, a tile's codes as one stream. Where a
        // tile is two vectors of rows (256-bit registers) they take turns every TURN groups, the second
        // on the lines the first just brought in; one vector through a whole tile and then the other would
        // leave the memory idle while the second computes, the prefetch having nothing new ahead of it.
        const int64_t turn = PARTS > 1 ? TURN : groups;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t t0, t1;
            tiles_of_block(b, blocks, tiles, &t0, &t1);
            for (int64_t t = t0; t < t1; t++)
                for (int64_t g0 = 0; g0 < groups; g0 += turn)
                    for (int64_t part = 0; part < PARTS; part++) {
                        const Rows w = rows_of(bits, codes, scale, minimum, groups, N, t, part);
                        if (w.live > 0) run[rows](K, &w, &xr, 0, g0, min64(g0 + turn, groups), N, y);
                    }
        }
        return KERNELS_OK;
    }
#if defined(WIDE_DOTS)
    if (bits == 4 && digits == 1) return gemm_unpacked(&xr, rows, K, codes, scale, minimum, N, y, blocks, threads);
    const int64_t span = SPAN;  // the int8 products read x as int16: twice the bytes
#else
    // Each span past the first reads the outputs back and writes them again; at 64 groups K = 2,048 (a 1-2B
    // model's width) is one span (docs/benchmarks/session56-amd/notes.md: span_ab.py, burst17_ab.py).
    const int64_t span = VNNI_SPAN;
#endif
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t t0, t1;
        tiles_of_block(b, blocks, tiles, &t0, &t1);
        for (int64_t g0 = 0; g0 < groups; g0 += span) {
            const int64_t g1 = min64(g0 + span, groups);
            for (int64_t r0 = 0; r0 < rows; r0 += GEMM_ROWS) {
                const int64_t R = min64(GEMM_ROWS, rows - r0);
                for (int64_t t = t0; t < t1; t++)
                    for (int64_t part = 0; part < PARTS; part++) {
                        const Rows w = rows_of(bits, codes, scale, minimum, groups, N, t, part);
                        if (w.live > 0) run[R](K, &w, &xr, r0, g0, g1, N, y);
                    }
            }
        }
    }
    return KERNELS_OK;
}

// Every row of x against every tile of a BITS-bit weight, x rounded first.
static int gemm(int bits, const float *x, int digits, int64_t rows, int64_t K, const void *codes,
                const void *scale, const uint16_t *minimum, int64_t N, float *y, int threads) {
    if (K % GROUP || (digits != 1 && digits != 2)) return KERNELS_BAD_SHAPE;
    static _Thread_local Scratch x_scratch;
    RoundedX xr;
    if (round_rows(round_row_simd, x, digits, rows, K, &x_scratch, &xr, threads)) return KERNELS_NO_MEMORY;
    return gemm_rounded(bits, xr, digits, rows, K, codes, scale, minimum, N, y, threads);
}

// x: [rows, K] fp32 (K a multiple of 32), digits: 1 or 2, codes / scale / minimum: the tiles of an
// [N, K] weight (kernels.h's Int4), y: [rows, N] fp32.
int int4_gemm(const float *x, int digits, int64_t rows, int64_t K, const uint8_t *codes,
              const uint16_t *scale, const uint16_t *minimum, int64_t N, float *y, int threads) {
    return gemm(4, x, digits, rows, K, codes, scale, minimum, N, y, threads);
}

// x: [rows, K] fp32 (K a multiple of 32), digits: 1 or 2, codes / scale: the tiles of an [N, K] weight
// (kernels.h's Int8), y: [rows, N] fp32.
int int8_gemm(const float *x, int digits, int64_t rows, int64_t K, const int8_t *codes, const float *scale,
              int64_t N, float *y, int threads) {
    return gemm(8, x, digits, rows, K, codes, scale, NULL, N, y, threads);
}

// The products of rows rounded by the layer that computed them (one digit).
static int products_rounded(int bits, RoundedX xr, int64_t rows, int64_t K, const void *codes, const void *scale,
                            const uint16_t *minimum, int64_t N, float *y, int threads) {
    return gemm_rounded(bits, xr, 1, rows, K, codes, scale, minimum, N, y, threads);
}

#else  // no SIMD: the references are the bodies

int int4_gemm(const float *x, int digits, int64_t rows, int64_t K, const uint8_t *codes,
              const uint16_t *scale, const uint16_t *minimum, int64_t N, float *y, int threads) {
    (void)threads;
    return int4_gemm_ref(x, digits, rows, K, codes, scale, minimum, N, y);
}

int int8_gemm(const float *x, int digits, int64_t rows, int64_t K, const int8_t *codes, const float *scale,
              int64_t N, float *y, int threads) {
    (void)threads;
    return int8_gemm_ref(x, digits, rows, K, codes, scale, N, y);
}

static int products_rounded(int bits, RoundedX xr, int64_t rows, int64_t K, const void *codes, const void *scale,
                            const uint16_t *minimum, int64_t N, float *y, int threads) {
    (void)threads;
    if (bits == 4)
        int4_products_ref(&xr, 1, rows, K, codes, scale, minimum, N, y);
    else
        int8_products_ref(&xr, 1, rows, K, codes, scale, N, y);
    return KERNELS_OK;
}

#endif

int int4_gemm_rounded(const int8_t *x_codes, const float *x_step, const int32_t *x_total, const float *x_sum,
                      int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum,
                      int64_t N, float *y, int threads) {
    if (K % GROUP) return KERNELS_BAD_SHAPE;
    return products_rounded(4, rounded_rows(x_codes, x_step, x_total, x_sum), rows, K, codes, scale, minimum, N, y,
                            threads);
}

int int8_gemm_rounded(const int8_t *x_codes, const float *x_step, const int32_t *x_total, const float *x_sum,
                      int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N, float *y,
                      int threads) {
    if (K % GROUP) return KERNELS_BAD_SHAPE;
    return products_rounded(8, rounded_rows(x_codes, x_step, x_total, x_sum), rows, K, codes, scale, NULL, N, y,
                            threads);
}

int round_rows_of(RowOf row_of, const void *context, int64_t rows, int64_t n, int8_t *codes, float *step,
                  int32_t *total, float *sum, int threads) {
    if (n % GROUP) return KERNELS_BAD_SHAPE;
#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)
    const RoundRow round_row = round_row_simd;
#else
    const RoundRow round_row = round_row_plain;
#endif
    const int64_t groups = n / GROUP;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (rows > 1)
    {
        static _Thread_local Scratch scratch;
        float *row = team_reserve(&scratch, sizeof(float) * (size_t)n, &failed);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (row == NULL) continue;
            row_of(context, r, row);
            round_row(row, n, 1, codes + r * n, NULL, step + r * groups, total + r * groups, sum + r * groups);
        }
    }
    return failed ? KERNELS_NO_MEMORY : KERNELS_OK;
}
