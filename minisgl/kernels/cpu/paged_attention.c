// Decode attention read in place from the paged KV pool (fp32 or bf16), one query token per
// request, after storing the new tokens' keys and values at their slots (rounded to bf16 for a bf16
// pool, as torch's cast rounds). Queries, scores and sums are fp32 either way.
//
// The torch path gathers every request's K and V into a padded copy per layer, then runs SDPA: at
// one request the gather, the views and the call cost ~60 us a layer, several times the
// arithmetic. Here each (request, KV head) reads its keys and values where they lie, for all the
// query heads that share them (GQA), with a numerically safe two-pass softmax.
//
// Threads: (request, KV head) pairs are split over `threads` OpenMP threads.

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include <stdlib.h>
#include <string.h>

#define MAX_GROUP 16  // query heads per KV head

// 16 values of a pool row (fp32, or bf16 widened) starting at element `at`.
static inline __m512 load_kv(const void *pool, int64_t at, int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)pool + at);
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)pool + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

static inline float dot(const float *a, const void *pool, int64_t at, int64_t d, int bf16) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load_kv(pool, at + i, bf16), acc);
    return _mm512_reduce_add_ps(acc);
}

// `count` fp32 values (a multiple of 16) into the pool at element `at`.
static void store_kv(void *pool, int64_t at, const float *x, int64_t count, int bf16) {
    if (!bf16) {
        memcpy((float *)pool + at, x, sizeof(float) * (size_t)count);
        return;
    }
    for (int64_t i = 0; i < count; i += 16)
        _mm256_storeu_si256((__m256i *)((uint16_t *)pool + at + i), round_to_bf16(_mm512_loadu_ps(x + i)));
}

// q: [batch, heads, d]; k, v: [batch, kv_heads, d], stored at out_slots[b] of k_pool, v_pool:
// [slots, kv_heads, d] (one layer's, bf16 if kv_bf16 else fp32); kv_slots: [batch, stride] slot of
// each key, the first kv_lens[b] of each row attended; out: [batch, heads, d]. d must be a multiple
// of 16.
int paged_decode_attention(const float *q, const float *k, const float *v, const int64_t *out_slots, void *k_pool,
                           void *v_pool, int kv_bf16, const int64_t *kv_slots, int64_t stride, const int64_t *kv_lens,
                           int64_t batch, int64_t heads, int64_t kv_heads, int64_t d, float scale, float *out,
                           int threads) {
    const int64_t group = heads / kv_heads, row = kv_heads * d;
    if (d % 16 || heads % kv_heads || group > MAX_GROUP) return 1;
    for (int64_t b = 0; b < batch; b++) {
        store_kv(k_pool, out_slots[b] * row, k + b * row, row, kv_bf16);
        store_kv(v_pool, out_slots[b] * row, v + b * row, row, kv_bf16);
    }
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; b++) longest = kv_lens[b] > longest ? kv_lens[b] : longest;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = malloc(sizeof(float) * (size_t)(group * (longest > 0 ? longest : 1)));
        if (scores == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < batch * kv_heads; task++) {
            if (scores == NULL) continue;
            const int64_t b = task / kv_heads, h = task % kv_heads, n = kv_lens[b];
            const int64_t *slots = kv_slots + b * stride;
            const float *qh = q + (b * heads + h * group) * d;
            float *oh = out + (b * heads + h * group) * d;
            float top[MAX_GROUP], total[MAX_GROUP];
            for (int64_t g = 0; g < group; g++) top[g] = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                const int64_t key = (slots[j] * kv_heads + h) * d;
                for (int64_t g = 0; g < group; g++) {
                    const float s = dot(qh + g * d, k_pool, key, d, kv_bf16) * scale;
                    scores[g * n + j] = s;
                    top[g] = s > top[g] ? s : top[g];
                }
            }
            for (int64_t g = 0; g < group; g++) {
                float sum = 0.0f;
                for (int64_t j = 0; j < n; j++) {
                    const float e = expf(scores[g * n + j] - top[g]);
                    scores[g * n + j] = e;
                    sum += e;
                }
                total[g] = sum;
            }
            // Accumulate the weighted values 16 dimensions at a time for every query head.
            for (int64_t i = 0; i < d; i += 16) {
                __m512 acc[MAX_GROUP];
                for (int64_t g = 0; g < group; g++) acc[g] = _mm512_setzero_ps();
                for (int64_t j = 0; j < n; j++) {
                    const __m512 value = load_kv(v_pool, (slots[j] * kv_heads + h) * d + i, kv_bf16);
                    for (int64_t g = 0; g < group; g++) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(scores[g * n + j]), value, acc[g]);
                }
                for (int64_t g = 0; g < group; g++)
                    _mm512_storeu_ps(oh + g * d + i, _mm512_div_ps(acc[g], _mm512_set1_ps(total[g] > 0.0f ? total[g] : 1.0f)));
            }
        }
        free(scores);
    }
    return failed ? 2 : 0;
}
