// Internal to the kernels (the boundary is kernels.h): which SIMD body this library compiles, and the
// helpers those bodies share. Every library is built from the same sources with its own -m flags
// (native.py's VARIANTS); the first instruction set below that the flags allow is compiled in, and a
// build with none of them compiles the plain C references as its bodies (torch's kernels beat that,
// so native.py never builds one for a CPU without AVX2).
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__FMA__) && defined(__F16C__)
#define KERNELS_AVX512 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AMX_INT8__) && defined(__AVX512BF16__) && \
    defined(__AVX512VBMI__)
// The AVX-512 bodies, prefill rows' products on the tile unit (bf16_gemm.c) and decode rows' integer sums
// there too (quant_gemm.c).
#define KERNELS_AMX 1
#define KERNELS_VARIANT "amx"
#else
#define KERNELS_VARIANT "avx512"
#endif
#elif defined(__x86_64__) && defined(__AVXVNNI__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KERNELS_AVX256 1
#define KERNELS_AVXVNNI 1
#define KERNELS_VARIANT "avxvnni"
#elif defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KERNELS_AVX256 1
#define KERNELS_VARIANT "avx2"
#else
#define KERNELS_VARIANT "scalar"
#endif

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)
#include <immintrin.h>
#endif

#if defined(KERNELS_AMX)
// The tile registers as bf16_gemm.c and prefill_attention.c use them: all eight 16 rows of 64 bytes
// (sums: 16 x 16 fp32; operands: 16 x 32 bf16, or 16 pairs of rows x 16 columns x 2). Each thread sets
// its own before its first tile instruction and releases them after its last.
typedef struct __attribute__((aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t columns[16];  // bytes per row of each tile register
    uint8_t rows[16];
    uint8_t unused[16];
} TileConfig;

// ldtilecfg from `c`. Not _tile_loadconfig: gcc 12's declares that it reads a pointer's 8 bytes of the
// configuration, so a caller's stores of the rows and columns can be dropped as dead (gcc -O2/-O3 do in a
// function of its own; docs/benchmarks/session37-spr/notes.md). This operand is the whole struct.
static inline void load_tile_config(const TileConfig *c) { __asm__ volatile("ldtilecfg %0" : : "m"(*c)); }

static inline void tiles_configure(void) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.columns[t] = 64;
    load_tile_config(&c);
}
#endif

// The quantized weights' formats (kernels.h's Int4, Int8): tiles of 16 output rows, groups of 32 columns.
enum { TILE = 16, GROUP = 32 };

// The 4-bit code of row o, column k of an int4 weight's tiles (kernels.h's Int4), for the references.
static inline int int4_code_at(const uint8_t *codes, int64_t K, int64_t o, int64_t k) {
    const int64_t g = k / GROUP, c = k % GROUP;
    const uint8_t byte = codes[((o / TILE * (K / GROUP) + g) * 4 + (c % 16) / 4) * 4 * TILE + o % TILE * 4 + c % 4];
    return c < 16 ? byte & 0x0F : byte >> 4;
}

// The 8-bit code of row o, column k of an int8 weight's tiles (kernels.h's Int8), for the references.
static inline int int8_code_at(const int8_t *codes, int64_t K, int64_t o, int64_t k) {
    return codes[((o / TILE * (K / GROUP) + k / GROUP) * 8 + k % GROUP / 4) * 4 * TILE + o % TILE * 4 + k % 4];
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static inline size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

// A grow-only buffer, one per thread and call site (declared `static _Thread_local`): the kernels'
// per-call temporaries without an allocation per call. NULL when the memory is not there.
typedef struct {
    void *data;
    size_t size;
} Scratch;

static inline void *scratch_reserve(Scratch *s, size_t bytes) {
    if (bytes <= s->size && s->data != NULL) return s->data;
    const size_t size = round64(bytes);  // aligned_alloc takes a multiple of the alignment
    void *data = aligned_alloc(64, size);
    if (data == NULL) return NULL;
    free(s->data);
    s->data = data;
    s->size = size;
    return data;
}

// scratch_reserve for a thread of a parallel region: where it fails, *failed (the team's flag) is set, so that
// the threads skip their work and the call returns KERNELS_NO_MEMORY.
static inline void *team_reserve(Scratch *s, size_t bytes, int *failed) {
    void *data = scratch_reserve(s, bytes);
    if (data == NULL) {
#pragma omp atomic write
        *failed = 1;
    }
    return data;
}

// Row r of a layer's output, computed into `to` from the layer's arguments `context`.
typedef void (*RowOf)(const void *context, int64_t r, float *to);

// A layer's rows [rows, n] (n a multiple of 32), each computed by row_of into a thread's buffer and rounded from
// there to one int8 digit per group of 32 columns as the quantized products round their rows (quant_gemm.c):
// codes [rows, n], and per row and group its step, its digits' total and their sum times the step. For the
// layers that hand their output to a product rounded (rms_norm_rounded, silu_mul_rounded).
int round_rows_of(RowOf row_of, const void *context, int64_t rows, int64_t n, int8_t *codes, float *step,
                  int32_t *total, float *sum, int threads);

// fp32 -> bf16 bits, rounded to nearest even (torch's cast): the pool's and the dequantized weights'
// rounding.
static inline uint16_t bf16_of(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (uint16_t)((bits + ((bits >> 16) & 1) + 0x7FFF) >> 16);
}

static inline float float_of_bf16(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

// IEEE fp16 bits -> fp32, in plain C for the references (the SIMD bodies use F16C).
static inline float float_of_fp16(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    uint32_t bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000 | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        uint32_t m = mantissa, e = 113;
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((m & 0x3FF) << 13);
    }
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

#if defined(KERNELS_AVX512)
// The bf16 dot products (vdpbf16ps: two bf16 products added to each fp32 lane) are not in the avx512 build's
// flags: the functions that use them take this attribute and run only where has_avx512_bf16().
#define BF16 __attribute__((target("avx512bf16,avx512dq")))

static inline int has_avx512_bf16(void) {
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512dq");
}

// 16 bf16 values of each of two rows, each dimension's two side by side (first's, then second's): the pairs
// vdpbf16ps multiplies by a pair of weights, one per row.
static inline __m512i interleave_rows(__m256i first, __m256i second) {
    static const uint16_t order[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1);
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(order), both);
}

static inline __m256i round_to_bf16_512(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}
#endif

#if defined(KERNELS_AVX256)
// fp32 rounded to bf16's precision, nearest even (bf16_of's rounding): each lane's bits, the low 16 zero.
static inline __m256i bf16_rounded_bits_256(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF));
    return _mm256_and_si256(_mm256_add_epi32(bits, bias), _mm256_set1_epi32((int)0xFFFF0000u));
}

// The same as fp32 values.
static inline __m256 rounded_to_bf16_256(__m256 v) { return _mm256_castsi256_ps(bf16_rounded_bits_256(v)); }

// The same as 8 bf16, in order.
static inline __m128i round_to_bf16_256(__m256 v) {
    const __m256i rounded = _mm256_srli_epi32(bf16_rounded_bits_256(v), 16);
    // Each 128-bit half packs its four values twice; quadwords 0 and 2 are the eight in order.
    const __m256i packed = _mm256_packus_epi32(rounded, rounded);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

static inline float sum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

// The float vector the SIMD bodies compute with, WIDTH lanes, and the operations they share.
#if defined(KERNELS_AVX512)
typedef __m512 VecF;
#define WIDTH 16
#define vec_zero _mm512_setzero_ps
#define vec_set1 _mm512_set1_ps
#define vec_load _mm512_loadu_ps
#define vec_store _mm512_storeu_ps
#define vec_fmadd _mm512_fmadd_ps
#define vec_add _mm512_add_ps
#define vec_sub _mm512_sub_ps
#define vec_mul _mm512_mul_ps
#define vec_div _mm512_div_ps
#define vec_max _mm512_max_ps
#define vec_min _mm512_min_ps
#define vec_round(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
// y x 2^n for whole n (vscalefps: one instruction).
#define vec_times_pow2 _mm512_scalef_ps
#define vec_reduce_add _mm512_reduce_add_ps
#define vec_reduce_max _mm512_reduce_max_ps
// Within each 128-bit lane, as SSE's unpcklps / unpckhps / shufps do.
#define vec_unpacklo _mm512_unpacklo_ps
#define vec_unpackhi _mm512_unpackhi_ps
#define vec_shuffle _mm512_shuffle_ps
// Bit i set where lane i of a equals lane i of b (ordered: never for a NaN), or where lane i is a NaN.
#define vec_equal_bits(a, b) ((unsigned)_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ))
#define vec_nan_bits(a) ((unsigned)_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q))
// The sum of a vector's 128-bit lanes.
static inline __m128 vec_fold128(VecF v) {
    // The upper 256 bits through the double view: extractf32x8 is AVX-512DQ, which the build does not ask for.
    const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(v), high);
    return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}
#elif defined(KERNELS_AVX256)
typedef __m256 VecF;
#define WIDTH 8
#define vec_zero _mm256_setzero_ps
#define vec_set1 _mm256_set1_ps
#define vec_load _mm256_loadu_ps
#define vec_store _mm256_storeu_ps
#define vec_fmadd _mm256_fmadd_ps
#define vec_add _mm256_add_ps
#define vec_sub _mm256_sub_ps
#define vec_mul _mm256_mul_ps
#define vec_div _mm256_div_ps
#define vec_max _mm256_max_ps
#define vec_min _mm256_min_ps
#define vec_round(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
// y x 2^n for whole n in fp32's normal range: n + 127 as the exponent field of 2^n.
#define vec_times_pow2(y, n)                                                                     \
    _mm256_mul_ps(y, _mm256_castsi256_ps(                                                        \
                         _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)))
#define vec_reduce_add sum256
static inline float vec_reduce_max(VecF v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
#define vec_unpacklo _mm256_unpacklo_ps
#define vec_unpackhi _mm256_unpackhi_ps
#define vec_shuffle _mm256_shuffle_ps
#define vec_equal_bits(a, b) ((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)))
#define vec_nan_bits(a) ((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)))
static inline __m128 vec_fold128(VecF v) { return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); }
#endif

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)
// e^x, WIDTH at a time: x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, so that n ln 2 is
// exact), e^r by Cephes' expf polynomial, times 2^n. Within a couple of fp32 ulps of expf for x in
// [-87, 88], where 2^n stays a normal fp32; x is clamped to that range first (e^-87 for less, e^88 for
// more); a NaN stays one (min and max give their second operand where either is a NaN).
static inline VecF vec_exp(VecF x) {
    x = vec_min(vec_set1(88.0f), vec_max(vec_set1(-87.0f), x));
    const VecF n = vec_round(vec_mul(x, vec_set1(1.44269504088896341f)));
    VecF r = vec_sub(x, vec_mul(n, vec_set1(0.693359375f)));
    r = vec_sub(r, vec_mul(n, vec_set1(-2.12194440e-4f)));
    VecF y = vec_set1(1.9875691500e-4f);
    y = vec_fmadd(y, r, vec_set1(1.3981999507e-3f));
    y = vec_fmadd(y, r, vec_set1(8.3334519073e-3f));
    y = vec_fmadd(y, r, vec_set1(4.1665795894e-2f));
    y = vec_fmadd(y, r, vec_set1(1.6666665459e-1f));
    y = vec_fmadd(y, r, vec_set1(5.0000001201e-1f));
    y = vec_add(vec_fmadd(y, vec_mul(r, r), r), vec_set1(1.0f));
    return vec_times_pow2(y, n);
}

// SwiGLU's activation of WIDTH columns, silu(gate) * up: silu_mul's arithmetic (activation.c), and the
// tile unit's products that take it on the way in (bf16_gemm.c), element by element the same bits.
static inline VecF vec_silu_mul(VecF gate, VecF up) {
    return vec_mul(vec_div(gate, vec_add(vec_set1(1.0f), vec_exp(vec_sub(vec_zero(), gate)))), up);
}

// The sums of four vectors, in that order: each pair's lanes interleaved and added, then the pairs'
// halves, then the 128-bit lanes (fewer shuffles than four reductions).
static inline __m128 sum4(VecF a, VecF b, VecF c, VecF d) {
    const VecF ab = vec_add(vec_unpacklo(a, b), vec_unpackhi(a, b));  // a0+a2 b0+b2 a1+a3 b1+b3 per lane
    const VecF cd = vec_add(vec_unpacklo(c, d), vec_unpackhi(c, d));
    const VecF low = vec_shuffle(ab, cd, _MM_SHUFFLE(1, 0, 1, 0));   // a0+a2 b0+b2 c0+c2 d0+d2
    const VecF high = vec_shuffle(ab, cd, _MM_SHUFFLE(3, 2, 3, 2));  // a1+a3 b1+b3 c1+c3 d1+d3
    const VecF abcd = vec_add(low, high);
    return vec_fold128(abcd);
}

// The largest lanes of four vectors, in that order: sum4's shuffles, with max in place of add.
static inline __m128 max4(VecF a, VecF b, VecF c, VecF d) {
    const VecF ab = vec_max(vec_unpacklo(a, b), vec_unpackhi(a, b));
    const VecF cd = vec_max(vec_unpacklo(c, d), vec_unpackhi(c, d));
    const VecF abcd = vec_max(vec_shuffle(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)), vec_shuffle(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
#if defined(KERNELS_AVX512)
    const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1));
    const __m256 half = _mm256_max_ps(_mm512_castps512_ps256(abcd), high);
#else
    const __m256 half = abcd;
#endif
    return _mm_max_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}
#endif
