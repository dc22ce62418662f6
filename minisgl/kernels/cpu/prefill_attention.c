// Prefill attention read from a bf16 paged KV pool: each request's new tokens attend causally to its
// cached prefix and to each other, their own keys and values already stored at their slots. Token t
// of a request with `prefix` cached tokens sees its keys 0 .. prefix + t.
//
// torch's SDPA runs this in fp32 (the queries' dtype), through a padded gathered copy where a
// prefix is cached. The SIMD body multiplies in bf16 with fp32 sums (AVX-512 BF16's vdpbf16ps: two
// bf16 products per fp32 lane, twice an fp32 FMA's work), as vLLM's and llama.cpp's 16-bit
// attention do: the queries and the softmax weights are rounded to bf16, the keys and values are
// the pool's own bf16. Each request's keys and values are packed once into the layouts vdpbf16ps
// pairs, all its KV heads in one pass over its pool rows (a head's slice of a row is only d values, a
// row apart from the next key's), and only past the slots it shares with the request before it: the
// requests of one pass often extend the same cached prefix, which would otherwise be packed again for
// each. Then blocks of ROWS query rows (token, query head of the group) are split over the threads: a
// block's scores for all the keys it sees (a two-pass softmax, no rescaling), its weights rounded to
// bf16, then the weighted values. A row sees the same keys in the same order whatever the pass it is
// in, so a token's attention is the same, bit for bit, in one pass or chunked, with its prefix cached
// or not, alone or beside requests that share it. The amx build runs blocks of 32 rows as AMX-BF16 tile
// products instead (attend_block_tiles), on the same packed keys and values, with the same guarantees. The
// AVX2 builds, without bf16 products, run the same arithmetic in fp32 fmas (below).

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

#define DIM_STEP 16  // head_dim must be a multiple of this (the values' vectors)

static int check_arguments(int64_t tokens, int64_t heads, int64_t kv_heads, int64_t d, int64_t slots,
                           const int64_t *kv_slots, int64_t stride, const int64_t *q_starts, const int64_t *new_lens,
                           const int64_t *prefix_lens, int64_t batch) {
    if (d % DIM_STEP || d == 0 || kv_heads < 1 || heads % kv_heads) return KERNELS_BAD_SHAPE;
    for (int64_t b = 0; b < batch; b++) {
        if (q_starts[b] < 0 || new_lens[b] < 0 || q_starts[b] + new_lens[b] > tokens) return KERNELS_BAD_SHAPE;
        if (prefix_lens[b] < 0 || prefix_lens[b] + new_lens[b] > stride) return KERNELS_BAD_KV_LEN;
        for (int64_t j = 0; j < prefix_lens[b] + new_lens[b]; j++)
            if (kv_slots[b * stride + j] < 0 || kv_slots[b * stride + j] >= slots) return KERNELS_BAD_KV_SLOT;
    }
    return KERNELS_OK;
}

static float rounded_to_bf16(float v) { return float_of_bf16(bf16_of(v)); }

int prefill_attention_ref(const float *q, int64_t q_stride, int64_t tokens, int64_t heads, int64_t kv_heads,
                          int64_t d, const uint16_t *k_pool, const uint16_t *v_pool, int64_t slots,
                          const int64_t *kv_slots, int64_t stride, const int64_t *q_starts, const int64_t *new_lens,
                          const int64_t *prefix_lens, int64_t batch, float scale, float *out) {
    const int invalid =
        check_arguments(tokens, heads, kv_heads, d, slots, kv_slots, stride, q_starts, new_lens, prefix_lens, batch);
    if (invalid) return invalid;
    int64_t longest = 1;
    for (int64_t b = 0; b < batch; b++)
        longest = prefix_lens[b] + new_lens[b] > longest ? prefix_lens[b] + new_lens[b] : longest;
    float *weights = malloc(sizeof(float) * (size_t)(longest + d));
    if (weights == NULL) return KERNELS_NO_MEMORY;
    float *query = weights + longest;
    const int64_t group = heads / kv_heads;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t t = 0; t < new_lens[b]; t++)
            for (int64_t h = 0; h < heads; h++) {
                const int64_t token = q_starts[b] + t, seen = prefix_lens[b] + t + 1, kv = h / group;
                const int64_t *keys = kv_slots + b * stride;
                for (int64_t i = 0; i < d; i++) query[i] = rounded_to_bf16(q[token * q_stride + h * d + i]);
                float top = -INFINITY, total = 0.0f;
                for (int64_t j = 0; j < seen; j++) {
                    const uint16_t *key = k_pool + (keys[j] * kv_heads + kv) * d;
                    float s = 0.0f;
                    for (int64_t i = 0; i < d; i++) s += query[i] * float_of_bf16(key[i]);
                    weights[j] = s * scale;
                    top = weights[j] > top ? weights[j] : top;
                }
                for (int64_t j = 0; j < seen; j++) {
                    const float e = expf(weights[j] - top);
                    total += e;
                    weights[j] = rounded_to_bf16(e);
                }
                for (int64_t i = 0; i < d; i++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < seen; j++)
                        acc += weights[j] * float_of_bf16(v_pool[(keys[j] * kv_heads + kv) * d + i]);
                    out[(token * heads + h) * d + i] = acc / total;
                }
            }
    free(weights);
    return KERNELS_OK;
}

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)

#define ROWS 8       // query rows of a block
#define KEYS 32      // keys per step of the AVX-512 scores (two vectors), and the padding of every key count
#define PACKED_BYTES (16 << 20)  // the packed keys and values of a round of heads, at most (one head at least)

static inline int64_t padded(int64_t n) { return (n + KEYS - 1) / KEYS * KEYS; }

// Dimensions i .. i + 15 of two keys' values, each dimension's two side by side (first's, then second's),
// to `to` (32 values).
static inline void store_value_pair(uint16_t *to, __m256i first, __m256i second) {
#if defined(KERNELS_AVX512)
    _mm512_storeu_si512(to, interleave_rows(first, second));
#else
    const __m256i low = _mm256_unpacklo_epi16(first, second), high = _mm256_unpackhi_epi16(first, second);
    _mm256_storeu_si256((__m256i *)to, _mm256_permute2x128_si256(low, high, 0x20));
    _mm256_storeu_si256((__m256i *)(to + 16), _mm256_permute2x128_si256(low, high, 0x31));
#endif
}

// Keys j .. j + 1 (j even) of KV heads h0 .. h1 packed, each head's into its own ld x d part of `keys` and
// `values`, read as whole pool rows (keys at or past n are zeros):
// - keys, for the scores: per block of 16 keys and pair of dimensions, the 16 keys' pairs side by side;
// - values, for the weighted sums: per pair of keys, each dimension's two values side by side.
static void pack_pair(const uint16_t *k_pool, const uint16_t *v_pool, const int64_t *slots, int64_t kv_heads,
                      int64_t h0, int64_t h1, int64_t d, int64_t n, int64_t j, int64_t ld, uint16_t *keys,
                      uint16_t *values) {
    for (int64_t h = h0; h < h1; h++) {
        const uint16_t *key[2], *value[2];
        for (int u = 0; u < 2; u++) {
            const int64_t at = (slots[j + u < n ? j + u : 0] * kv_heads + h) * d;
            key[u] = k_pool + at, value[u] = v_pool + at;
        }
        uint16_t *head_keys = keys + (h - h0) * ld * d, *head_values = values + (h - h0) * ld * d;
        for (int u = 0; u < 2; u++) {
            uint16_t *block = head_keys + ((j + u) / 16) * 16 * d + ((j + u) % 16) * 2;
            for (int64_t i = 0; i < d; i += 2) {
                uint32_t pair = 0;  // a key's two dimensions as one word
                if (j + u < n) memcpy(&pair, key[u] + i, sizeof pair);
                memcpy(block + i * 16, &pair, sizeof pair);
            }
        }
        uint16_t *pair = head_values + (j / 2) * 2 * d;
        for (int64_t i = 0; i < d; i += 16) {
            const __m256i first = j < n ? _mm256_loadu_si256((const __m256i *)(value[0] + i)) : _mm256_setzero_si256();
            const __m256i second =
                j + 1 < n ? _mm256_loadu_si256((const __m256i *)(value[1] + i)) : _mm256_setzero_si256();
            store_value_pair(pair + 2 * i, first, second);
        }
    }
}

// 2^f for f in [0, 1), by its minimax quartic: within 3e-6 of it, where a weight's rounding to bf16 is 4e-3
// (vec_exp's fp32 accuracy would buy nothing here, at twice the instructions).
static inline VecF exp2_fraction(VecF f) {
    VecF p = vec_set1(1.3534121e-2f);
    p = vec_fmadd(p, f, vec_set1(5.2011482e-2f));
    p = vec_fmadd(p, f, vec_set1(2.4144280e-1f));
    p = vec_fmadd(p, f, vec_set1(6.9300383e-1f));
    return vec_fmadd(p, f, vec_set1(1.0000026f));
}

// One block of ROWS rows, rows first.. of (request, KV head): row r is token r / group, query head
// h * group + r % group; `rows` of them in all.
typedef struct {
    const float *q;
    int64_t q_stride, heads, group, d, h, token0, prefix, rows;
    float scale;
    const uint16_t *keys, *values;  // packed
    float *out;
} Head;

#endif

#if defined(KERNELS_AVX512)

#define CHUNKS 4     // value vectors (16 dimensions each) a row's weighted sum holds at once
#define ROW_GROUP 4  // rows whose weighted sums run together: ROW_GROUP x CHUNKS accumulators

typedef uint16_t Rounded;  // a query or weight rounded to bf16, as this body holds it: its bits

int prefill_attention_runs(void) { return has_avx512_bf16(); }

// Scores of ROWS bf16 query rows (`query`: [ROWS, d]) with `keys` packed keys, unscaled: [ROWS, ld].
BF16 static void score_block(const uint16_t *query, const uint16_t *packed, int64_t d, int64_t keys, float *scores,
                             int64_t ld) {
    const int64_t pairs = d / 2;
    const int32_t *q32 = (const int32_t *)query;
    for (int64_t j = 0; j < keys; j += KEYS) {
        __m512 acc[ROWS][2];
        for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        const uint16_t *first = packed + j * d, *second = first + 16 * d;
        for (int64_t i = 0; i < pairs; i++) {
            const __m512bh a = (__m512bh)_mm512_loadu_si512(first + i * 32);
            const __m512bh b = (__m512bh)_mm512_loadu_si512(second + i * 32);
            for (int r = 0; r < ROWS; r++) {
                const __m512bh qr = (__m512bh)_mm512_set1_epi32(q32[r * pairs + i]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qr, a);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qr, b);
            }
        }
        for (int r = 0; r < ROWS; r++) {
            _mm512_storeu_ps(scores + r * ld + j, acc[r][0]);
            _mm512_storeu_ps(scores + r * ld + j + 16, acc[r][1]);
        }
    }
}

// e^((raw - top) scale) of 16 raw scores, for weights rounded to bf16 (8 bits): as 2^t, t = (raw - top) x
// scale x log2 e in one fma (c = scale x log2 e, top_c = top x c), 2^t = 2^floor(t) 2^f with f = t - floor(t)
// in [0, 1) in one instruction (vreduceps), 2^f by exp2_fraction and 2^floor(t) by vscalefps, which floors its
// exponent itself. t is held at -127 or above, so that an overflowing product gives a weight of about 0 rather
// than -inf - -inf; a NaN stays one (max gives its second operand where either is a NaN).
BF16 static inline __m512 weight_of(__m512 raw, __m512 c, __m512 top_c) {
    const __m512 t = _mm512_max_ps(_mm512_set1_ps(-127.0f), _mm512_fmsub_ps(raw, c, top_c));
    const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return _mm512_scalef_ps(exp2_fraction(f), t);
}

// A row's softmax numerators over its `seen` keys (its raw scores times `scale`), rounded to bf16 into
// `weights` (zero up to `keys`): their fp32 sum. The scale is positive, so the largest raw score is the
// largest scaled one, and the scaling folds into weight_of's first fma. Whole vectors of seen keys go
// unmasked; the last part one and the padding after it masked.
BF16 static float weigh_row(const float *scores, float scale, int64_t seen, int64_t keys, uint16_t *weights) {
    __m512 top = _mm512_set1_ps(-INFINITY);
    const int64_t whole = seen / 16 * 16;
    for (int64_t j = 0; j < whole; j += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(scores + j));
    if (whole < seen) {
        const __mmask16 in = (__mmask16)((1u << (seen - whole)) - 1);
        top = _mm512_mask_max_ps(top, in, top, _mm512_maskz_loadu_ps(in, scores + whole));
    }
    const float c = scale * 1.44269504088896341f;
    const __m512 times = _mm512_set1_ps(c), top_c = _mm512_set1_ps(_mm512_reduce_max_ps(top) * c);
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < whole; j += 16) {
        const __m512 e = weight_of(_mm512_loadu_ps(scores + j), times, top_c);
        total = _mm512_add_ps(total, e);
        _mm256_storeu_si256((__m256i *)(weights + j), (__m256i)_mm512_cvtneps_pbh(e));
    }
    for (int64_t j = whole; j < keys; j += 16) {
        const int64_t left = seen - j;
        const __mmask16 in = (__mmask16)(left >= 16 ? 0xFFFF : left <= 0 ? 0 : (1u << left) - 1);
        const __m512 e = _mm512_maskz_mov_ps(in, weight_of(_mm512_loadu_ps(scores + j), times, top_c));
        total = _mm512_add_ps(total, e);
        _mm256_storeu_si256((__m256i *)(weights + j), (__m256i)_mm512_cvtneps_pbh(e));
    }
    return _mm512_reduce_add_ps(total);
}

// Weighted sums of `pairs` pairs of packed values for ROW_GROUP rows (weights [ROW_GROUP, ld] bf16),
// dimensions i .. i + 16 chunks, divided by each row's total into out[r] + i.
BF16 static inline __attribute__((always_inline)) void sum_values(const int chunks, const uint16_t *weights,
                                                                 int64_t ld, const uint16_t *packed, int64_t d,
                                                                 int64_t i, int64_t pairs, const float *total,
                                                                 float *const *out) {
    __m512 acc[ROW_GROUP][CHUNKS];
    for (int r = 0; r < ROW_GROUP; r++)
        for (int c = 0; c < chunks; c++) acc[r][c] = _mm512_setzero_ps();
    const int32_t *w32 = (const int32_t *)weights;
    for (int64_t m = 0; m < pairs; m++) {
        __m512bh v[CHUNKS];
        for (int c = 0; c < chunks; c++) v[c] = (__m512bh)_mm512_loadu_si512(packed + (m * d + i + 16 * c) * 2);
        for (int r = 0; r < ROW_GROUP; r++) {
            const __m512bh w = (__m512bh)_mm512_set1_epi32(w32[r * (ld / 2) + m]);
            for (int c = 0; c < chunks; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], w, v[c]);
        }
    }
    for (int r = 0; r < ROW_GROUP; r++) {
        if (out[r] == NULL) continue;
        const __m512 inverse = _mm512_set1_ps(1.0f / total[r]);
        for (int c = 0; c < chunks; c++) _mm512_storeu_ps(out[r] + i + 16 * c, _mm512_mul_ps(acc[r][c], inverse));
    }
}

BF16 static void sum_values_1(const uint16_t *w, int64_t ld, const uint16_t *p, int64_t d, int64_t i, int64_t pairs,
                              const float *total, float *const *out) {
    sum_values(1, w, ld, p, d, i, pairs, total, out);
}
BF16 static void sum_values_4(const uint16_t *w, int64_t ld, const uint16_t *p, int64_t d, int64_t i, int64_t pairs,
                              const float *total, float *const *out) {
    sum_values(CHUNKS, w, ld, p, d, i, pairs, total, out);
}

// A block's `count` rows from `first`: their queries in bf16 into `query` [count, d], where each one's
// output goes (NULL for the rows past the last, which repeat it) and how many keys each sees.
BF16 static void block_rows_of(const Head *a, int64_t first, int count, uint16_t *query, float **out,
                               int64_t *seen) {
    const int64_t d = a->d, last_row = min64(first + count, a->rows) - 1;
    for (int r = 0; r < count; r++) {
        const int64_t row = min64(first + r, last_row), t = row / a->group;
        const int64_t head = a->h * a->group + row % a->group;
        const float *q = a->q + (a->token0 + t) * a->q_stride + head * d;
        for (int64_t i = 0; i < d; i += 16)
            _mm256_storeu_si256((__m256i *)(query + r * d + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(q + i)));
        out[r] = first + r <= last_row ? a->out + ((a->token0 + t) * a->heads + head) * d : NULL;
        seen[r] = a->prefix + t + 1;
    }
}

BF16 static void attend_block(const Head *a, int64_t first, uint16_t *query, float *scores, uint16_t *weights,
                              int64_t ld) {
    const int64_t d = a->d;
    float *out[ROWS];
    int64_t seen[ROWS];
    block_rows_of(a, first, ROWS, query, out, seen);
    const int64_t keys = padded(seen[ROWS - 1]);  // the last row sees the most
    score_block(query, a->keys, d, keys, scores, ld);
    float total[ROWS];
    for (int r = 0; r < ROWS; r++)
        total[r] = weigh_row(scores + r * ld, a->scale, seen[r], keys, weights + r * ld);
    for (int g = 0; g < ROWS; g += ROW_GROUP) {
        const int64_t pairs = (seen[g + ROW_GROUP - 1] + 1) / 2;
        const uint16_t *w = weights + g * ld;
        int64_t i = 0;
        for (; i + CHUNKS * 16 <= d; i += CHUNKS * 16) sum_values_4(w, ld, a->values, d, i, pairs, total + g, out + g);
        for (; i < d; i += 16) sum_values_1(w, ld, a->values, d, i, pairs, total + g, out + g);
    }
}

#if defined(KERNELS_AMX)
#define TILE_ROWS 16                      // a tile register's rows
#define BLOCK_ROWS_TILES (2 * TILE_ROWS)  // query rows of a block on the tile unit: two tile registers' worth

// Sum register c's 16 rows x 16 dimensions (rows TILE_ROWS half .., dimensions i + 16 part ..) stored, and
// divided by each row's total into out[row] + i + 16 part.
#define SUMS_OUT(c, half, part)                                                                   \
    do {                                                                                          \
        _tile_stored(c, sums, 16 * sizeof(float));                                                \
        for (int r = 0; r < TILE_ROWS; r++) {                                                     \
            const int row = (half) * TILE_ROWS + r;                                               \
            if (out[row] == NULL) continue;                                                       \
            const __m512 inverse = _mm512_set1_ps(1.0f / total[row]);                             \
            const __m512 sum = _mm512_load_ps(sums + r * 16);                                     \
            _mm512_storeu_ps(out[row] + i + 16 * (part), _mm512_mul_ps(sum, inverse));            \
        }                                                                                         \
    } while (0)

// attend_block's work for BLOCK_ROWS_TILES rows on the tile unit (AMX-BF16), head_dim a multiple of 32. The
// packed keys are the layout a tile product takes (per block of 16 keys, 16 pairs of dimensions a
// 32-dimension step), as are the packed values (per 16 pairs of keys, each row 16 dimensions x 2). The block's
// two halves of 16 rows share each key and value tile loaded, half the tiles a block of 16 rows loaded per tile
// product: the scores of 32 rows x 32 keys sum in four registers, the weighted sums of 32 rows x 32 dimensions
// too. A row's sums run over the same keys in the same steps of 32 whatever its block: keys past its own weigh
// 0, and each row of a tile product is its own.
BF16 static void attend_block_tiles(const Head *a, int64_t first, uint16_t *query, float *scores,
                                    uint16_t *weights, int64_t ld) {
    const int64_t d = a->d;
    float *out[BLOCK_ROWS_TILES];
    int64_t seen[BLOCK_ROWS_TILES];
    block_rows_of(a, first, BLOCK_ROWS_TILES, query, out, seen);
    const int64_t keys = padded(seen[BLOCK_ROWS_TILES - 1]);  // the last row sees the most
    const size_t score_stride = sizeof(float) * (size_t)ld, weight_stride = sizeof(uint16_t) * (size_t)ld;
    const size_t query_stride = sizeof(uint16_t) * (size_t)d;
    const uint16_t *second_query = query + TILE_ROWS * d;
    float *second_scores = scores + TILE_ROWS * ld;
    for (int64_t j = 0; j < keys; j += KEYS) {
        const uint16_t *block = a->keys + j * d;  // keys j .. j + 15, then j + 16 .. j + 31
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t i = 0; i < d; i += 32) {
            _tile_loadd(4, query + i, query_stride);
            _tile_loadd(5, second_query + i, query_stride);
            _tile_loadd(6, block + i * 16, 64);
            _tile_loadd(7, block + 16 * d + i * 16, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, scores + j, score_stride);
        _tile_stored(1, scores + j + 16, score_stride);
        _tile_stored(2, second_scores + j, score_stride);
        _tile_stored(3, second_scores + j + 16, score_stride);
    }
    float total[BLOCK_ROWS_TILES];
    for (int r = 0; r < BLOCK_ROWS_TILES; r++)
        total[r] = weigh_row(scores + r * ld, a->scale, seen[r], keys, weights + r * ld);
    float sums[TILE_ROWS * 16] __attribute__((aligned(64)));
    const size_t value_stride = sizeof(uint16_t) * 2 * (size_t)d;
    const uint16_t *second_weights = weights + TILE_ROWS * ld;
    for (int64_t i = 0; i < d; i += 32) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t j = 0; j < keys; j += KEYS) {
            const uint16_t *pairs = a->values + j * d + 2 * i;  // key pairs j / 2 .., dimensions i ..
            _tile_loadd(4, weights + j, weight_stride);
            _tile_loadd(5, second_weights + j, weight_stride);
            _tile_loadd(6, pairs, value_stride);
            _tile_loadd(7, pairs + 32, value_stride);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        SUMS_OUT(0, 0, 0);
        SUMS_OUT(1, 0, 1);
        SUMS_OUT(2, 1, 0);
        SUMS_OUT(3, 1, 1);
    }
}
#endif

#elif defined(KERNELS_AVX256)
// With AVX2 alone, no bf16 products: the same arithmetic in fp32 fmas. A bf16 value is an fp32 one whose low
// 16 bits are zero, so each product of two is exact in fp32, and the sums are fp32 as vdpbf16ps's are (in an
// order of this body's own: its bits are its own, with the same guarantees). The queries and the weights are
// held as fp32 values rounded to bf16, which the fmas take broadcast from memory; a packed word's two bf16
// values are taken apart in registers (the low one shifted up, the high one masked).

#define ROWS_AT_ONCE 4  // rows whose scores (16 keys) or weighted sums (16 dimensions) run together: 8 accumulators
#define DIMS 16         // dimensions of a pass of the weighted sums

typedef float Rounded;  // a query or weight rounded to bf16, as this body holds it: an fp32 value

int prefill_attention_runs(void) { return 1; }

static inline __m256 low_values(__m256i words) { return _mm256_castsi256_ps(_mm256_slli_epi32(words, 16)); }

static inline __m256 high_values(__m256i words) {
    return _mm256_castsi256_ps(_mm256_and_si256(words, _mm256_set1_epi32((int)0xFFFF0000u)));
}

// Scores of ROWS query rows (`query`: [ROWS, d]) with `keys` packed keys, unscaled: [ROWS, ld].
static void score_block(const float *query, const uint16_t *packed, int64_t d, int64_t keys, float *scores,
                        int64_t ld) {
    for (int64_t j = 0; j < keys; j += 16) {
        const uint16_t *block = packed + j * d;
        for (int r0 = 0; r0 < ROWS; r0 += ROWS_AT_ONCE) {
            __m256 acc[ROWS_AT_ONCE][2];
            for (int r = 0; r < ROWS_AT_ONCE; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
            for (int64_t i = 0; i < d; i += 2) {  // a pair of dimensions: 16 keys' words, 8 a vector
                const __m256i first = _mm256_loadu_si256((const __m256i *)(block + i * 16));
                const __m256i second = _mm256_loadu_si256((const __m256i *)(block + i * 16 + 16));
                const __m256 k0 = low_values(first), k1 = high_values(first);
                const __m256 k2 = low_values(second), k3 = high_values(second);
                for (int r = 0; r < ROWS_AT_ONCE; r++) {
                    const float *q = query + (r0 + r) * d + i;
                    const __m256 even = _mm256_set1_ps(q[0]), odd = _mm256_set1_ps(q[1]);
                    acc[r][0] = _mm256_fmadd_ps(odd, k1, _mm256_fmadd_ps(even, k0, acc[r][0]));
                    acc[r][1] = _mm256_fmadd_ps(odd, k3, _mm256_fmadd_ps(even, k2, acc[r][1]));
                }
            }
            for (int r = 0; r < ROWS_AT_ONCE; r++) {
                _mm256_storeu_ps(scores + (r0 + r) * ld + j, acc[r][0]);
                _mm256_storeu_ps(scores + (r0 + r) * ld + j + 8, acc[r][1]);
            }
        }
    }
}

// e^((raw - top) scale) of 8 raw scores: the AVX-512 body's 2^t, with 2^floor(t) put in the exponent field
// (vec_times_pow2; t held at -127 or above, 2^-127 comes out 0). A NaN stays one.
static inline __m256 weight_of(__m256 raw, __m256 c, __m256 top_c) {
    const __m256 t = _mm256_max_ps(_mm256_set1_ps(-127.0f), _mm256_fmsub_ps(raw, c, top_c));
    const __m256 whole = _mm256_round_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return vec_times_pow2(exp2_fraction(_mm256_sub_ps(t, whole)), whole);
}

// Lanes j .. j + 7 that are below `seen`, as a mask of whole lanes.
static inline __m256 seen_lanes(int64_t seen, int64_t j) {
    const int64_t left = seen - j;
    const __m256i count = _mm256_set1_epi32((int)(left < 0 ? 0 : left > 8 ? 8 : left));
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(count, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

// A row's softmax numerators over its `seen` keys (its raw scores times `scale`), rounded to bf16 into
// `weights` (zero up to `keys`): their fp32 sum (the AVX-512 body's weigh_row).
static float weigh_row(const float *scores, float scale, int64_t seen, int64_t keys, float *weights) {
    __m256 top = _mm256_set1_ps(-INFINITY);
    const int64_t whole = seen / 8 * 8;
    for (int64_t j = 0; j < whole; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(scores + j));
    if (whole < seen)
        top = _mm256_max_ps(top, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(scores + whole),
                                                  seen_lanes(seen, whole)));
    const float c = scale * 1.44269504088896341f;
    const __m256 times = _mm256_set1_ps(c), top_c = _mm256_set1_ps(vec_reduce_max(top) * c);
    __m256 total = _mm256_setzero_ps();
    for (int64_t j = 0; j < keys; j += 8) {
        __m256 e = weight_of(_mm256_loadu_ps(scores + j), times, top_c);
        if (j + 8 > whole) e = _mm256_and_ps(e, seen_lanes(seen, j));
        total = _mm256_add_ps(total, e);
        _mm256_storeu_ps(weights + j, rounded_to_bf16_256(e));
    }
    return sum256(total);
}

// Weighted sums of `pairs` pairs of packed values for ROWS_AT_ONCE rows (weights [ROWS_AT_ONCE, ld]),
// dimensions i .. i + DIMS, divided by each row's total into out[r] + i.
static void sum_values(const float *weights, int64_t ld, const uint16_t *packed, int64_t d, int64_t i,
                       int64_t pairs, const float *total, float *const *out) {
    __m256 acc[ROWS_AT_ONCE][2];
    for (int r = 0; r < ROWS_AT_ONCE; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t m = 0; m < pairs; m++) {  // keys 2m and 2m + 1: 8 dimensions' words a vector
        const uint16_t *words = packed + (m * d + i) * 2;
        const __m256i first = _mm256_loadu_si256((const __m256i *)words);
        const __m256i second = _mm256_loadu_si256((const __m256i *)(words + 16));
        const __m256 v0 = low_values(first), v1 = high_values(first);
        const __m256 v2 = low_values(second), v3 = high_values(second);
        for (int r = 0; r < ROWS_AT_ONCE; r++) {
            const float *w = weights + r * ld + 2 * m;
            const __m256 even = _mm256_set1_ps(w[0]), odd = _mm256_set1_ps(w[1]);
            acc[r][0] = _mm256_fmadd_ps(odd, v1, _mm256_fmadd_ps(even, v0, acc[r][0]));
            acc[r][1] = _mm256_fmadd_ps(odd, v3, _mm256_fmadd_ps(even, v2, acc[r][1]));
        }
    }
    for (int r = 0; r < ROWS_AT_ONCE; r++) {
        if (out[r] == NULL) continue;
        const __m256 inverse = _mm256_set1_ps(1.0f / total[r]);
        _mm256_storeu_ps(out[r] + i, _mm256_mul_ps(acc[r][0], inverse));
        _mm256_storeu_ps(out[r] + i + 8, _mm256_mul_ps(acc[r][1], inverse));
    }
}

// A block's rows from `first`: their queries rounded to bf16 into `query` [ROWS, d], where each one's output
// goes (NULL for the rows past the last, which repeat it) and how many keys each sees.
static void block_rows_of(const Head *a, int64_t first, float *query, float **out, int64_t *seen) {
    const int64_t d = a->d, last_row = min64(first + ROWS, a->rows) - 1;
    for (int r = 0; r < ROWS; r++) {
        const int64_t row = min64(first + r, last_row), t = row / a->group;
        const int64_t head = a->h * a->group + row % a->group;
        const float *q = a->q + (a->token0 + t) * a->q_stride + head * d;
        for (int64_t i = 0; i < d; i += 8) _mm256_storeu_ps(query + r * d + i, rounded_to_bf16_256(_mm256_loadu_ps(q + i)));
        out[r] = first + r <= last_row ? a->out + ((a->token0 + t) * a->heads + head) * d : NULL;
        seen[r] = a->prefix + t + 1;
    }
}

static void attend_block(const Head *a, int64_t first, float *query, float *scores, float *weights, int64_t ld) {
    const int64_t d = a->d;
    float *out[ROWS];
    int64_t seen[ROWS];
    block_rows_of(a, first, query, out, seen);
    const int64_t keys = padded(seen[ROWS - 1]);  // the last row sees the most
    score_block(query, a->keys, d, keys, scores, ld);
    float total[ROWS];
    for (int r = 0; r < ROWS; r++) total[r] = weigh_row(scores + r * ld, a->scale, seen[r], keys, weights + r * ld);
    for (int g = 0; g < ROWS; g += ROWS_AT_ONCE) {
        const int64_t pairs = (seen[g + ROWS_AT_ONCE - 1] + 1) / 2;
        for (int64_t i = 0; i < d; i += DIMS)
            sum_values(weights + g * ld, ld, a->values, d, i, pairs, total + g, out + g);
    }
}

#endif

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)

int prefill_attention(const float *q, int64_t q_stride, int64_t tokens, int64_t heads, int64_t kv_heads,
                      int64_t d, const uint16_t *k_pool, const uint16_t *v_pool, int64_t slots,
                      const int64_t *kv_slots, int64_t stride, const int64_t *q_starts, const int64_t *new_lens,
                      const int64_t *prefix_lens, int64_t batch, float scale, float *out, int threads) {
    if (!prefill_attention_runs()) return KERNELS_NO_INSTRUCTIONS;
    const int invalid =
        check_arguments(tokens, heads, kv_heads, d, slots, kv_slots, stride, q_starts, new_lens, prefix_lens, batch);
    if (invalid) return invalid;
    int64_t longest = 1;
    for (int64_t b = 0; b < batch; b++)
        longest = prefix_lens[b] + new_lens[b] > longest ? prefix_lens[b] + new_lens[b] : longest;
    const int64_t ld = padded(longest);
    // Heads packed at a time: all of them where their packed keys and values fit PACKED_BYTES (the whole
    // request is then read row by row, once), else fewer a round.
    const int64_t head_bytes = 2 * (int64_t)sizeof(uint16_t) * ld * d;
    const int64_t round_heads = min64(kv_heads, head_bytes < PACKED_BYTES ? PACKED_BYTES / head_bytes : 1);
    static _Thread_local Scratch packing;  // the calling thread's: the packed keys and values, shared
    uint16_t *packed_keys = scratch_reserve(&packing, (size_t)(round_heads * head_bytes));
    if (packed_keys == NULL) return KERNELS_NO_MEMORY;
    uint16_t *packed_values = packed_keys + round_heads * ld * d;
    // Keys of request b already packed by request b - 1 (an even count): the slots they share from
    // position 0, as requests extending one cached prefix do.
    int64_t *kept = malloc(sizeof(int64_t) * (size_t)(batch > 0 ? batch : 1));
    if (kept == NULL) return KERNELS_NO_MEMORY;
    for (int64_t b = 0; b < batch; b++) {
        int64_t same = 0;
        if (b > 0) {
            const int64_t most = min64(prefix_lens[b - 1] + new_lens[b - 1], prefix_lens[b] + new_lens[b]);
            while (same < most && kv_slots[b * stride + same] == kv_slots[(b - 1) * stride + same]) same++;
        }
        kept[b] = same / 2 * 2;
    }
    const int64_t group = heads / kv_heads;
#if defined(KERNELS_AMX)
    const int tiles = d % 32 == 0;  // the tile unit's blocks (a tile register's row is 32 bf16)
    const int64_t block_rows = tiles ? BLOCK_ROWS_TILES : ROWS;
#else
    const int64_t block_rows = ROWS;
#endif
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        // Each thread's block: its queries [rows, d], scores [rows, ld] and weights [rows, ld].
        static _Thread_local Scratch scratch;
        const size_t per_row = sizeof(Rounded) * (size_t)(d + ld) + sizeof(float) * (size_t)ld;
        Rounded *query = team_reserve(&scratch, (size_t)block_rows * per_row, &failed);
        float *scores = (float *)(query + block_rows * d);
        Rounded *weights = (Rounded *)(scores + block_rows * ld);
#if defined(KERNELS_AMX)
        if (tiles) tiles_configure();
#endif
        for (int64_t h0 = 0; h0 < kv_heads; h0 += round_heads) {
            const int64_t h1 = min64(h0 + round_heads, kv_heads);
            for (int64_t b = 0; b < batch; b++) {
                const int64_t n = prefix_lens[b] + new_lens[b];
                const int64_t *slots_b = kv_slots + b * stride;
#pragma omp for schedule(static)
                for (int64_t j = kept[b]; j < padded(n); j += 2)
                    pack_pair(k_pool, v_pool, slots_b, kv_heads, h0, h1, d, n, j, ld, packed_keys, packed_values);
                const int64_t rows = new_lens[b] * group, blocks = (rows + block_rows - 1) / block_rows;
                // Head after head, each one's largest blocks first: the later rows see more keys.
#pragma omp for schedule(dynamic, 1)
                for (int64_t task = 0; task < (h1 - h0) * blocks; task++) {
                    const int64_t h = h0 + task / blocks;
                    const Head head = {q, q_stride, heads, group, d, h, q_starts[b], prefix_lens[b], rows, scale,
                                       packed_keys + (h - h0) * ld * d, packed_values + (h - h0) * ld * d, out};
                    const int64_t first = (blocks - 1 - task % blocks) * block_rows;
                    if (query == NULL) continue;
#if defined(KERNELS_AMX)
                    if (tiles) {
                        attend_block_tiles(&head, first, query, scores, weights, ld);
                        continue;
                    }
#endif
                    attend_block(&head, first, query, scores, weights, ld);
                }
            }
        }
#if defined(KERNELS_AMX)
        if (tiles) _tile_release();
#endif
    }
    free(kept);
    return failed ? KERNELS_NO_MEMORY : KERNELS_OK;
}

#else  // no SIMD body: torch's SDPA runs prefill attention

int prefill_attention_runs(void) { return 0; }

int prefill_attention(const float *q, int64_t q_stride, int64_t tokens, int64_t heads, int64_t kv_heads,
                      int64_t d, const uint16_t *k_pool, const uint16_t *v_pool, int64_t slots,
                      const int64_t *kv_slots, int64_t stride, const int64_t *q_starts, const int64_t *new_lens,
                      const int64_t *prefix_lens, int64_t batch, float scale, float *out, int threads) {
    (void)q, (void)q_stride, (void)tokens, (void)heads, (void)kv_heads, (void)d, (void)k_pool, (void)v_pool;
    (void)slots, (void)kv_slots, (void)stride, (void)q_starts, (void)new_lens, (void)prefix_lens, (void)batch;
    (void)scale, (void)out, (void)threads;
    return KERNELS_NO_INSTRUCTIONS;
}

#endif
