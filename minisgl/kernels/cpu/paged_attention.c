// Decode attention read in place from the paged KV pool (fp32 or bf16), one query token per
// request, after storing the new tokens' keys and values at their slots (rounded to bf16 for a bf16
// pool, as torch's cast rounds). Queries, scores and sums are fp32 either way.
//
// The torch path gathers every request's K and V into a padded copy per layer, then runs SDPA: at
// one request the gather, the views and the call cost ~60 us a layer, several times the
// arithmetic. Here each (request, KV head) reads its keys and values where they lie, for all the
// query heads that share them (GQA), with a numerically safe two-pass softmax. The SIMD body dots a
// query with KEYS keys at once, exponentiates the scores a vector at a time, and reads each row of
// values once per pass (CHUNKS vectors of it): with many requests the step is bound by reading the
// pool, a row of which is kv_heads x d values (4 KB at 32 heads of 64, bf16).
//
// Threads: (KV head, request) pairs are split over `threads` OpenMP threads, KV head outer.

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

#define MAX_GROUP 16  // query heads per KV head
#define DIM_STEP 16   // head_dim must be a multiple of this (every body's vector width divides it)

// q: [batch, heads, d]; k, v: [batch, kv_heads, d], stored at out_slots[b] of k_pool, v_pool:
// [slots, kv_heads, d] (one layer's, bf16 if kv_bf16 else fp32); kv_slots: [batch, stride] slot of
// each key, the first kv_lens[b] of each row attended; out: [batch, heads, d]. The slots and lengths
// are checked before anything is written (a pass over batch x attended keys: little beside the
// dot products).
static int check_arguments(const int64_t *out_slots, int64_t slots, const int64_t *kv_slots, int64_t stride,
                           const int64_t *kv_lens, int64_t batch, int64_t heads, int64_t kv_heads, int64_t d) {
    if (d % DIM_STEP || kv_heads < 1 || heads % kv_heads || heads / kv_heads > MAX_GROUP) return KERNELS_BAD_SHAPE;
    for (int64_t b = 0; b < batch; b++) {
        if (out_slots[b] < 0 || out_slots[b] >= slots) return KERNELS_BAD_OUT_SLOT;
        if (kv_lens[b] < 0 || kv_lens[b] > stride) return KERNELS_BAD_KV_LEN;
        for (int64_t j = 0; j < kv_lens[b]; j++)
            if (kv_slots[b * stride + j] < 0 || kv_slots[b * stride + j] >= slots) return KERNELS_BAD_KV_SLOT;
    }
    return KERNELS_OK;
}

static float read_kv(const void *pool, int64_t at, int bf16) {
    return bf16 ? float_of_bf16(((const uint16_t *)pool)[at]) : ((const float *)pool)[at];
}

static void store_kv_plain(void *pool, int64_t at, const float *x, int64_t count, int bf16) {
    for (int64_t i = 0; i < count; i++) {
        if (bf16)
            ((uint16_t *)pool)[at + i] = bf16_of(x[i]);
        else
            ((float *)pool)[at + i] = x[i];
    }
}

int paged_decode_attention_ref(const float *q, const float *k, const float *v, const int64_t *out_slots,
                               void *k_pool, void *v_pool, int64_t slots, int kv_bf16, const int64_t *kv_slots,
                               int64_t stride, const int64_t *kv_lens, int64_t batch, int64_t heads,
                               int64_t kv_heads, int64_t d, float scale, float *out) {
    const int invalid = check_arguments(out_slots, slots, kv_slots, stride, kv_lens, batch, heads, kv_heads, d);
    if (invalid) return invalid;
    const int64_t group = heads / kv_heads, row = kv_heads * d;
    for (int64_t b = 0; b < batch; b++) {
        store_kv_plain(k_pool, out_slots[b] * row, k + b * row, row, kv_bf16);
        store_kv_plain(v_pool, out_slots[b] * row, v + b * row, row, kv_bf16);
    }
    int64_t longest = 1;
    for (int64_t b = 0; b < batch; b++) longest = kv_lens[b] > longest ? kv_lens[b] : longest;
    float *scores = malloc(sizeof(float) * (size_t)longest);
    if (scores == NULL) return KERNELS_NO_MEMORY;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            const int64_t kv = h / group, n = kv_lens[b];
            const float *qh = q + (b * heads + h) * d;
            float top = -INFINITY, total = 0.0f;
            for (int64_t j = 0; j < n; j++) {
                const int64_t key = (kv_slots[b * stride + j] * kv_heads + kv) * d;
                float s = 0.0f;
                for (int64_t i = 0; i < d; i++) s += qh[i] * read_kv(k_pool, key + i, kv_bf16);
                scores[j] = s * scale;
                top = fmaxf(top, scores[j]);
            }
            for (int64_t j = 0; j < n; j++) {
                scores[j] = expf(scores[j] - top);
                total += scores[j];
            }
            float *oh = out + (b * heads + h) * d;
            for (int64_t i = 0; i < d; i++) {
                float acc = 0.0f;
                for (int64_t j = 0; j < n; j++)
                    acc += scores[j] * read_kv(v_pool, (kv_slots[b * stride + j] * kv_heads + kv) * d + i, kv_bf16);
                oh[i] = acc / (total > 0.0f ? total : 1.0f);
            }
        }
    free(scores);
    return KERNELS_OK;
}

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)

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
#define vec_max _mm512_max_ps
#define vec_round(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
// 2^n for whole n in fp32's normal range: n + 127 as the exponent field.
#define vec_pow2(n) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define vec_div _mm512_div_ps
#define vec_sum _mm512_reduce_add_ps
// WIDTH values of a pool row (fp32, or bf16 widened) starting at element `at`.
static inline VecF load_kv(const void *pool, int64_t at, int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)pool + at);
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)pool + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
static inline void store_bf16(uint16_t *to, VecF x) { _mm256_storeu_si256((__m256i *)to, round_to_bf16_512(x)); }
#else
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
#define vec_max _mm256_max_ps
#define vec_round(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vec_pow2(n) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define vec_div _mm256_div_ps
#define vec_sum sum256
static inline VecF load_kv(const void *pool, int64_t at, int bf16) {
    if (!bf16) return _mm256_loadu_ps((const float *)pool + at);
    const __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)pool + at));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}
static inline void store_bf16(uint16_t *to, VecF x) { _mm_storeu_si128((__m128i *)to, round_to_bf16_256(x)); }
#endif

// e^x for x <= 0 (scores minus their maximum), WIDTH at a time: x = n ln 2 + r with |r| <= ln 2 / 2
// (ln 2 in two parts, so that n ln 2 is exact), e^r by Cephes' expf polynomial, times 2^n. Within
// a couple of fp32 ulps of expf; below -87 (e^x under fp32's smallest normal), e^-87; a NaN stays one
// (max gives its second operand where either is a NaN).
static inline VecF vec_exp(VecF x) {
    x = vec_max(vec_set1(-87.0f), x);
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
    return vec_mul(y, vec_pow2(n));
}

// A request's keys lie a pool row apart (or further): no hardware prefetcher follows them, so each
// key's lines are asked for this many keys ahead.
#define AHEAD 16

static inline void prefetch_kv(const void *pool, int64_t at, int64_t d, int bf16) {
    const char *first = (const char *)pool + at * (bf16 ? 2 : 4);
    for (int64_t byte = 0; byte < d * (bf16 ? 2 : 4); byte += 64) _mm_prefetch(first + byte, _MM_HINT_T0);
}

#define KEYS 4    // keys a query is dotted with at once: independent chains of fmas
#define CHUNKS 4  // vectors of a row of values summed at once (independent chains)

// a . pool[key[u] ..] for the first `count` (at most KEYS) keys, into out.
static inline void dot_keys(const float *a, const void *pool, const int64_t *key, int64_t count, int64_t d, int bf16,
                            float *out) {
    VecF acc[KEYS];
    for (int64_t u = 0; u < KEYS; u++) acc[u] = vec_zero();
    for (int64_t i = 0; i < d; i += WIDTH) {
        const VecF x = vec_load(a + i);
        for (int64_t u = 0; u < count; u++) acc[u] = vec_fmadd(x, load_kv(pool, key[u] + i, bf16), acc[u]);
    }
    for (int64_t u = 0; u < count; u++) out[u] = vec_sum(acc[u]);
}

// `count` fp32 values (a multiple of WIDTH) into the pool at element `at`.
static void store_kv(void *pool, int64_t at, const float *x, int64_t count, int bf16) {
    if (!bf16) {
        memcpy((float *)pool + at, x, sizeof(float) * (size_t)count);
        return;
    }
    for (int64_t i = 0; i < count; i += WIDTH) store_bf16((uint16_t *)pool + at + i, vec_load(x + i));
}

int paged_decode_attention(const float *q, const float *k, const float *v, const int64_t *out_slots, void *k_pool,
                           void *v_pool, int64_t slots, int kv_bf16, const int64_t *kv_slots, int64_t stride,
                           const int64_t *kv_lens, int64_t batch, int64_t heads, int64_t kv_heads, int64_t d,
                           float scale, float *out, int threads) {
    const int invalid = check_arguments(out_slots, slots, kv_slots, stride, kv_lens, batch, heads, kv_heads, d);
    if (invalid) return invalid;
    const int64_t group = heads / kv_heads, row = kv_heads * d;
    for (int64_t b = 0; b < batch; b++) {
        store_kv(k_pool, out_slots[b] * row, k + b * row, row, kv_bf16);
        store_kv(v_pool, out_slots[b] * row, v + b * row, row, kv_bf16);
    }
    int64_t longest = 1;
    for (int64_t b = 0; b < batch; b++) longest = kv_lens[b] > longest ? kv_lens[b] : longest;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        static _Thread_local Scratch scratch;  // each thread's scores, kept for its next call
        float *scores = scratch_reserve(&scratch, sizeof(float) * (size_t)(group * longest));
        if (scores == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < batch * kv_heads; task++) {
            if (scores == NULL) continue;
            // KV head outer: requests that share a prefix read the same rows close together in time.
            const int64_t h = task / batch, b = task % batch, n = kv_lens[b];
            const int64_t *slots = kv_slots + b * stride;
            const float *qh = q + (b * heads + h * group) * d;
            float *oh = out + (b * heads + h * group) * d;
            float top[MAX_GROUP], total[MAX_GROUP];
            for (int64_t g = 0; g < group; g++) top[g] = -INFINITY;
            for (int64_t j = 0; j < n; j += KEYS) {  // KEYS keys at a time: independent chains
                const int64_t count = n - j < KEYS ? n - j : KEYS;
                int64_t key[KEYS];
                for (int64_t u = 0; u < count; u++) key[u] = (slots[j + u] * kv_heads + h) * d;
                for (int64_t u = j + AHEAD; u < j + AHEAD + KEYS && u < n; u++)
                    prefetch_kv(k_pool, (slots[u] * kv_heads + h) * d, d, kv_bf16);
                for (int64_t g = 0; g < group; g++) {
                    float dots[KEYS];
                    dot_keys(qh + g * d, k_pool, key, count, d, kv_bf16, dots);
                    for (int64_t u = 0; u < count; u++) {
                        const float s = dots[u] * scale;
                        scores[g * n + j + u] = s;
                        top[g] = s > top[g] ? s : top[g];
                    }
                }
            }
            for (int64_t g = 0; g < group; g++) {
                float *row = scores + g * n;
                VecF sums = vec_zero();
                int64_t j = 0;
                for (; j + WIDTH <= n; j += WIDTH) {
                    const VecF e = vec_exp(vec_sub(vec_load(row + j), vec_set1(top[g])));
                    vec_store(row + j, e);
                    sums = vec_add(sums, e);
                }
                float sum = vec_sum(sums);
                for (; j < n; j++) {
                    row[j] = expf(row[j] - top[g]);
                    sum += row[j];
                }
                total[g] = sum;
            }
            // The weighted values, CHUNKS vectors of dimensions at a time for each query head: each row
            // of values is read once per pass whatever d (4 KB apart, a row read in several passes would
            // leave the cache between them).
            for (int64_t i = 0; i < d; i += CHUNKS * WIDTH) {
                const int64_t chunks = (d - i) / WIDTH < CHUNKS ? (d - i) / WIDTH : CHUNKS;
                for (int64_t g = 0; g < group; g++) {
                    VecF even[CHUNKS], odd[CHUNKS];  // two chains per vector: even and odd keys
                    for (int64_t c = 0; c < CHUNKS; c++) even[c] = odd[c] = vec_zero();
                    const float *weight = scores + g * n;
                    for (int64_t j = 0; j < n; j += 2) {
                        for (int64_t u = j + AHEAD; u < j + AHEAD + 2 && u < n; u++)
                            prefetch_kv(v_pool, (slots[u] * kv_heads + h) * d + i, chunks * WIDTH, kv_bf16);
                        const int64_t row = (slots[j] * kv_heads + h) * d + i;
                        const VecF w = vec_set1(weight[j]);
                        for (int64_t c = 0; c < chunks; c++)
                            even[c] = vec_fmadd(w, load_kv(v_pool, row + c * WIDTH, kv_bf16), even[c]);
                        if (j + 1 == n) break;
                        const int64_t next = (slots[j + 1] * kv_heads + h) * d + i;
                        const VecF w1 = vec_set1(weight[j + 1]);
                        for (int64_t c = 0; c < chunks; c++)
                            odd[c] = vec_fmadd(w1, load_kv(v_pool, next + c * WIDTH, kv_bf16), odd[c]);
                    }
                    const VecF divisor = vec_set1(total[g] > 0.0f ? total[g] : 1.0f);
                    for (int64_t c = 0; c < chunks; c++)
                        vec_store(oh + g * d + i + c * WIDTH, vec_div(vec_add(even[c], odd[c]), divisor));
                }
            }
        }
    }
    return failed ? KERNELS_NO_MEMORY : KERNELS_OK;
}

#else  // no SIMD: the reference is the body

int paged_decode_attention(const float *q, const float *k, const float *v, const int64_t *out_slots, void *k_pool,
                           void *v_pool, int64_t slots, int kv_bf16, const int64_t *kv_slots, int64_t stride,
                           const int64_t *kv_lens, int64_t batch, int64_t heads, int64_t kv_heads, int64_t d,
                           float scale, float *out, int threads) {
    (void)threads;
    return paged_decode_attention_ref(q, k, v, out_slots, k_pool, v_pool, slots, kv_bf16, kv_slots, stride, kv_lens,
                                      batch, heads, kv_heads, d, scale, out);
}

#endif
