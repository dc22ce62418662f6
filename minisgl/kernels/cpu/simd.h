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
#define KERNELS_VARIANT "avx512"
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

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

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
static inline __m256i round_to_bf16_512(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}
#endif

#if defined(KERNELS_AVX256)
static inline __m128i round_to_bf16_256(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
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
