// Decode attention read in place from the paged KV pool (fp32 or bf16), one query token per
// request, after storing the new tokens' keys and values at their slots (rounded to bf16 for a bf16
// pool, as torch's cast rounds). Queries, scores and sums are fp32 either way.
//
// The torch path gathers every request's K and V into a padded copy per layer, then runs SDPA: at
// one request the gather, the views and the call cost ~60 us a layer, several times the
// arithmetic. Here each (request, KV head) reads its keys and values where they lie, for all the
// query heads that share them (GQA), with a numerically safe two-pass softmax. The SIMD body dots up
// to QUERIES query heads with KEYS keys at once, loading each key vector once for them all (with 3 query
// heads per KV head, as at 135M, the loads were most of the work), exponentiates the scores a vector at
// a time, and reads each row of values once per pass (CHUNKS vectors of it), again once for up to
// QUERIES heads: with many requests the step is bound by reading the pool, a row of which is
// kv_heads x d values (4 KB at 32 heads of 64, bf16).
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
#define QUERIES 4  // query heads that share each key and value vector loaded (registers: 4 x 4 sums)
// WIDTH values of a pool row (fp32, or bf16 widened) starting at element `at`.
static inline VecF load_kv(const void *pool, int64_t at, int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)pool + at);
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)pool + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
static inline void store_bf16(uint16_t *to, VecF x) { _mm256_storeu_si256((__m256i *)to, round_to_bf16_512(x)); }
#else
#define QUERIES 2  // 16 registers: 2 x 4 sums
static inline VecF load_kv(const void *pool, int64_t at, int bf16) {
    if (!bf16) return _mm256_loadu_ps((const float *)pool + at);
    const __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)pool + at));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}
static inline void store_bf16(uint16_t *to, VecF x) { _mm_storeu_si128((__m128i *)to, round_to_bf16_256(x)); }
#endif

// A request's keys lie a pool row apart (or further): no hardware prefetcher follows them, so each
// key's lines are asked for this many keys ahead.
#define AHEAD 16

static inline void prefetch_kv(const void *pool, int64_t at, int64_t d, int bf16) {
    const char *first = (const char *)pool + at * (bf16 ? 2 : 4);
    for (int64_t byte = 0; byte < d * (bf16 ? 2 : 4); byte += 64) _mm_prefetch(first + byte, _MM_HINT_T0);
}

#define KEYS 4    // keys dotted at once: independent chains of fmas, reduced together by sum4
#define CHUNKS 4  // vectors of a row of values summed at once (independent chains)

// The scaled dots of `nq` query heads (d apart from q) with the KEYS keys at pool[rows[u] ..], into
// out[a * out_stride + u]. Each key vector is loaded (and widened) once for all nq heads. Called with a
// literal nq (dot_keys_of), so that the loops over heads unroll into registers.
static inline __attribute__((always_inline)) void dot_keys(const int nq, const float *q, const void *pool,
                                                           const int64_t *rows, int64_t d, int bf16, float scale,
                                                           float *out, int64_t out_stride) {
    VecF acc[QUERIES][KEYS];
    for (int a = 0; a < nq; a++)
        for (int u = 0; u < KEYS; u++) acc[a][u] = vec_zero();
    for (int64_t i = 0; i < d; i += WIDTH) {
        VecF x[QUERIES];
        for (int a = 0; a < nq; a++) x[a] = vec_load(q + a * d + i);
        for (int u = 0; u < KEYS; u++) {
            const VecF key = load_kv(pool, rows[u] + i, bf16);
            for (int a = 0; a < nq; a++) acc[a][u] = vec_fmadd(x[a], key, acc[a][u]);
        }
    }
    for (int a = 0; a < nq; a++)
        _mm_storeu_ps(out + a * out_stride,
                      _mm_mul_ps(sum4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]), _mm_set1_ps(scale)));
}

typedef void (*DotKeys)(const float *, const void *, const int64_t *, int64_t, int, float, float *, int64_t);
#define DOT_KEYS(NQ)                                                                                                 \
    static void dot_keys_##NQ(const float *q, const void *pool, const int64_t *rows, int64_t d, int bf16,           \
                              float scale, float *out, int64_t out_stride) {                                        \
        dot_keys(NQ, q, pool, rows, d, bf16, scale, out, out_stride);                                              \
    }
DOT_KEYS(1)
DOT_KEYS(2)
#if QUERIES == 4
DOT_KEYS(3)
DOT_KEYS(4)
static const DotKeys dot_keys_of[QUERIES + 1] = {NULL, dot_keys_1, dot_keys_2, dot_keys_3, dot_keys_4};
#else
static const DotKeys dot_keys_of[QUERIES + 1] = {NULL, dot_keys_1, dot_keys_2};
#endif

// out[a * d + c * WIDTH ..] = sum over j < n of weights[a * weight_stride + j] pool[rows[j] + at + c * WIDTH ..],
// divided by totals[a], for `nq` query heads and `chunks` vectors: each value vector is loaded once for
// all nq heads. With fewer than 8 chains (nq x chunks), even and odd keys sum apart, which keeps 8 fmas
// in flight. Called with literal nq and chunks (sum_values_of).
static inline __attribute__((always_inline)) void sum_values(const int nq, const int chunks, const float *weights,
                                                             int64_t weight_stride, const float *totals,
                                                             const void *pool, const int64_t *rows, int64_t at,
                                                             int64_t n, int bf16, int64_t d, float *out) {
    const int pairs = nq * chunks < 8;
    VecF even[QUERIES][CHUNKS], odd[QUERIES][CHUNKS];
    for (int a = 0; a < nq; a++)
        for (int c = 0; c < chunks; c++) even[a][c] = odd[a][c] = vec_zero();
    int64_t j = 0;
    for (; j + pairs < n; j += 1 + pairs) {
        if (j + AHEAD < n) prefetch_kv(pool, rows[j + AHEAD] + at, chunks * WIDTH, bf16);
        for (int c = 0; c < chunks; c++) {
            const VecF value = load_kv(pool, rows[j] + at + c * WIDTH, bf16);
            for (int a = 0; a < nq; a++)
                even[a][c] = vec_fmadd(vec_set1(weights[a * weight_stride + j]), value, even[a][c]);
        }
        if (!pairs) continue;
        if (j + 1 + AHEAD < n) prefetch_kv(pool, rows[j + 1 + AHEAD] + at, chunks * WIDTH, bf16);
        for (int c = 0; c < chunks; c++) {
            const VecF value = load_kv(pool, rows[j + 1] + at + c * WIDTH, bf16);
            for (int a = 0; a < nq; a++)
                odd[a][c] = vec_fmadd(vec_set1(weights[a * weight_stride + j + 1]), value, odd[a][c]);
        }
    }
    for (; j < n; j++)
        for (int c = 0; c < chunks; c++) {
            const VecF value = load_kv(pool, rows[j] + at + c * WIDTH, bf16);
            for (int a = 0; a < nq; a++)
                even[a][c] = vec_fmadd(vec_set1(weights[a * weight_stride + j]), value, even[a][c]);
        }
    for (int a = 0; a < nq; a++) {
        const VecF divisor = vec_set1(totals[a] > 0.0f ? totals[a] : 1.0f);
        for (int c = 0; c < chunks; c++)
            vec_store(out + a * d + c * WIDTH, vec_div(vec_add(even[a][c], odd[a][c]), divisor));
    }
}

typedef void (*SumValues)(const float *, int64_t, const float *, const void *, const int64_t *, int64_t, int64_t, int,
                          int64_t, float *);
#define SUM_VALUES(NQ, C)                                                                                           \
    static void sum_values_##NQ##_##C(const float *weights, int64_t weight_stride, const float *totals,              \
                                      const void *pool, const int64_t *rows, int64_t at, int64_t n, int bf16,        \
                                      int64_t d, float *out) {                                                      \
        sum_values(NQ, C, weights, weight_stride, totals, pool, rows, at, n, bf16, d, out);                         \
    }
#define SUM_VALUES_ROW(NQ) SUM_VALUES(NQ, 1) SUM_VALUES(NQ, 2) SUM_VALUES(NQ, 3) SUM_VALUES(NQ, 4)
#define SUM_VALUES_OF(NQ) {NULL, sum_values_##NQ##_1, sum_values_##NQ##_2, sum_values_##NQ##_3, sum_values_##NQ##_4}
SUM_VALUES_ROW(1)
SUM_VALUES_ROW(2)
#if QUERIES == 4
SUM_VALUES_ROW(3)
SUM_VALUES_ROW(4)
static const SumValues sum_values_of[QUERIES + 1][CHUNKS + 1] = {
    {NULL}, SUM_VALUES_OF(1), SUM_VALUES_OF(2), SUM_VALUES_OF(3), SUM_VALUES_OF(4)};
#else
static const SumValues sum_values_of[QUERIES + 1][CHUNKS + 1] = {{NULL}, SUM_VALUES_OF(1), SUM_VALUES_OF(2)};
#endif

// e^(x - top) of a row of n scores, in place, and their sum.
static float exponentiate(float *row, int64_t n, float top) {
    VecF sums = vec_zero();
    int64_t j = 0;
    for (; j + WIDTH <= n; j += WIDTH) {
        const VecF e = vec_exp(vec_sub(vec_load(row + j), vec_set1(top)));
        vec_store(row + j, e);
        sums = vec_add(sums, e);
    }
    float sum = vec_reduce_add(sums);
    for (; j < n; j++) {
        row[j] = expf(row[j] - top);
        sum += row[j];
    }
    return sum;
}

// The largest of n scores, NaNs passed over (max gives its second operand, the running maximum, where
// the score is a NaN), as the reference's comparison does; -inf for none.
static float largest(const float *row, int64_t n) {
    VecF tops = vec_set1(-INFINITY);
    int64_t j = 0;
    for (; j + WIDTH <= n; j += WIDTH) tops = vec_max(vec_load(row + j), tops);
    float top = vec_reduce_max(tops);
    for (; j < n; j++) top = row[j] > top ? row[j] : top;
    return top;
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
    const int64_t padded = (longest + KEYS - 1) / KEYS * KEYS;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        // Each thread's scores ([group, padded]) and key offsets ([padded]), kept for its next call.
        static _Thread_local Scratch scratch;
        float *scores = scratch_reserve(&scratch, (sizeof(float) * (size_t)group + sizeof(int64_t)) * (size_t)padded);
        if (scores == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        int64_t *rows = (int64_t *)(scores + group * padded);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < batch * kv_heads; task++) {
            if (scores == NULL) continue;
            // KV head outer: requests that share a prefix read the same rows close together in time.
            const int64_t h = task / batch, b = task % batch, n = kv_lens[b];
            const int64_t keys = (n + KEYS - 1) / KEYS * KEYS;  // a last partial block dots key 0 again
            const int64_t *slots = kv_slots + b * stride;
            const float *qh = q + (b * heads + h * group) * d;
            float *oh = out + (b * heads + h * group) * d;
            for (int64_t j = 0; j < keys; j++) rows[j] = (slots[j < n ? j : 0] * kv_heads + h) * d;
            for (int64_t j = 0; j < keys; j += KEYS) {
                for (int64_t u = j + AHEAD; u < j + AHEAD + KEYS && u < n; u++)
                    prefetch_kv(k_pool, rows[u], d, kv_bf16);
                for (int64_t g = 0; g < group; g += QUERIES) {
                    const int64_t nq = group - g < QUERIES ? group - g : QUERIES;
                    dot_keys_of[nq](qh + g * d, k_pool, rows + j, d, kv_bf16, scale, scores + g * keys + j, keys);
                }
            }
            float total[MAX_GROUP];
            for (int64_t g = 0; g < group; g++) {
                float *row = scores + g * keys;
                total[g] = exponentiate(row, n, largest(row, n));
            }
            // The weighted values, CHUNKS vectors of dimensions at a time: each row of values is read once
            // per pass whatever d (4 KB apart, a row read in several passes would leave the cache between them).
            for (int64_t i = 0; i < d; i += CHUNKS * WIDTH) {
                const int64_t chunks = (d - i) / WIDTH < CHUNKS ? (d - i) / WIDTH : CHUNKS;
                for (int64_t g = 0; g < group; g += QUERIES) {
                    const int64_t nq = group - g < QUERIES ? group - g : QUERIES;
                    sum_values_of[nq][chunks](scores + g * keys, keys, total + g, v_pool, rows, i, n, kv_bf16, d,
                                              oh + g * d + i);
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
