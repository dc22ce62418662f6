// Decode attention read in place from the paged KV pool (fp32 or bf16), one query token per
// request, after storing the new tokens' keys and values at their slots (rounded to bf16 for a bf16
// pool, as torch's cast rounds). Scores and sums are fp32. The products are fp32 too, but for a bf16 pool
// where decode_attention_bf16(): there the queries and softmax weights are rounded to bf16 and multiplied by the
// pool's values on vdpbf16ps (bf16_products, attend_bf16), without widening them.
//
// The torch path gathers every request's K and V into a padded copy per layer, then runs SDPA: at
// one request the gather, the views and the call cost ~60 us a layer, several times the
// arithmetic. Here each request reads its keys and values where they lie, for all the query heads
// that share them (GQA), with a numerically safe two-pass softmax over each chunk of its keys. The
// SIMD body dots up to QUERIES query heads with KEYS keys at once, loading each key vector once for
// them all (with 3 query heads per KV head, as at 135M, the loads were most of the work),
// exponentiates the scores a vector at a time, and adds KEYS keys' values at a time to every query
// head's sums, each value vector loaded once for its query heads.
//
// Decode is bound by reading the pool, a row of which is kv_heads x d values (4 KB at 32 heads of 64,
// bf16). A task reads whole rows, key after key, of a chunk of a request's keys, and the chunks'
// partial sums are merged after (chunk_keys). Rows are read in order: one head's d values lie a row
// apart, and a chunk read head by head instead finds few of them still in L1, since rows a page apart
// share L1's sets. For the same reason the keys ahead are asked for into L2
// (prefetcht1), not L1. Read rate per shape against a plain sum over the same rows:
// python -m benchmarks.decode_attention (docs/benchmarks/session20-amd/decode_attention.md).
//
// Requests whose keys begin with the same slots (a prefix the radix cache holds once: a system prompt,
// a conversation's history) form a group, and each whole chunk inside the run they all share is one
// task for the group: its rows read once and dotted with every member's query heads, instead of read
// and dotted once per member. A member's chunks are the ones it would have alone, each row's sums in
// the same order, so its output is the same bits alone as in its group. Such a task has many query rows
// per KV head: it widens its keys and values into fp32 buffers once for them all (attend_staged; the 256-bit
// builds a block of keys at a time), where a task of few rows reads them from the pool as it goes.
//
// Threads: the tasks (a chunk of a request's keys or of a group's shared run, or some of its KV heads
// where the chunks are too few for the threads: head_blocks) are split over `threads` OpenMP threads,
// the requests inner.

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

#define MAX_GROUP 16  // query heads per KV head
#define DIM_STEP 16   // head_dim must be a multiple of this (every body's vector width divides it)

// The new tokens' slots (and the head shape they are stored in), checked before anything is stored.
static int check_new_kv(const int64_t *out_slots, int64_t tokens, int64_t slots, int64_t kv_heads, int64_t d) {
    if (d % DIM_STEP || kv_heads < 1) return KERNELS_BAD_SHAPE;
    for (int64_t t = 0; t < tokens; t++)
        if (out_slots[t] < 0 || out_slots[t] >= slots) return KERNELS_BAD_OUT_SLOT;
    return KERNELS_OK;
}

// q: [batch, heads, d]; k, v: [batch, kv_heads, d] (each request's row q_stride, k_stride, v_stride floats after
// the one before: kernels.h), stored at out_slots[b] of k_pool, v_pool:
// [slots, kv_heads, d] (one layer's, bf16 if kv_bf16 else fp32); kv_slots: [batch, stride] slot of
// each key, the first kv_lens[b] of each row attended; out: [batch, heads, d]. The slots and lengths
// are checked before anything is written (a pass over batch x attended keys: little beside the
// dot products).
static int check_arguments(const int64_t *out_slots, int64_t slots, const int64_t *kv_slots, int64_t stride,
                           const int64_t *kv_lens, int64_t batch, int64_t heads, int64_t kv_heads, int64_t d) {
    const int invalid = check_new_kv(out_slots, batch, slots, kv_heads, d);
    if (invalid) return invalid;
    if (heads % kv_heads || heads / kv_heads > MAX_GROUP) return KERNELS_BAD_SHAPE;
    for (int64_t b = 0; b < batch; b++) {
        if (kv_lens[b] < 0 || kv_lens[b] > stride) return KERNELS_BAD_KV_LEN;
        for (int64_t j = 0; j < kv_lens[b]; j++)
            if (kv_slots[b * stride + j] < 0 || kv_slots[b * stride + j] >= slots) return KERNELS_BAD_KV_SLOT;
    }
    return KERNELS_OK;
}

// Where decode_attention_bf16() (kernels.h), a bf16 pool's keys and values are multiplied by queries and
// softmax weights rounded to bf16 (each product of two bf16 values, exact in fp32), as prefill attention
// does and as vLLM's and llama.cpp's 16-bit attention do; the weights' total is of the unrounded ones.
static float bf16_products(float x, int bf16) { return bf16 ? float_of_bf16(bf16_of(x)) : x; }

// vdpbf16ps does twice an fp32 fma's multiplies, at the same rate where AMD's cores (Zen 4 and later) issue it
// (3.6 G a second of either on the 2-core EPYC VM: docs/benchmarks/session40-amd/notes.md). Sapphire Rapids
// issues a quarter as many as fmas (session 32): fp32 products there, and in the builds without AVX-512.
int decode_attention_bf16(void) {
#if defined(KERNELS_AVX512)
    return has_avx512_bf16() && __builtin_cpu_is("amd");
#else
    return 0;
#endif
}

// Whether a pool of this dtype is read with bf16 products (bf16_products), the reference's and the body's rule.
static int multiplies_in_bf16(int kv_bf16) { return kv_bf16 && decode_attention_bf16(); }

// A row of bf16 queries: d values rounded up to whole vdpbf16ps steps of 32 dimensions (zeros past d).
static inline int64_t padded_dim(int64_t d) { return (d + 31) / 32 * 32; }

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

int paged_decode_attention_ref(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                               int64_t v_stride, const int64_t *out_slots, void *k_pool, void *v_pool, int64_t slots,
                               int kv_bf16, const int64_t *kv_slots, int64_t stride, const int64_t *kv_lens,
                               int64_t batch, int64_t heads, int64_t kv_heads, int64_t d, float scale, float *out) {
    const int invalid = check_arguments(out_slots, slots, kv_slots, stride, kv_lens, batch, heads, kv_heads, d);
    if (invalid) return invalid;
    const int64_t group = heads / kv_heads, row = kv_heads * d;
    for (int64_t b = 0; b < batch; b++) {
        store_kv_plain(k_pool, out_slots[b] * row, k + b * k_stride, row, kv_bf16);
        store_kv_plain(v_pool, out_slots[b] * row, v + b * v_stride, row, kv_bf16);
    }
    int64_t longest = 1;
    for (int64_t b = 0; b < batch; b++) longest = kv_lens[b] > longest ? kv_lens[b] : longest;
    float *scores = malloc(sizeof(float) * (size_t)(longest + d));
    if (scores == NULL) return KERNELS_NO_MEMORY;
    float *qh = scores + longest;
    const int rounded = multiplies_in_bf16(kv_bf16);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            const int64_t kv = h / group, n = kv_lens[b];
            for (int64_t i = 0; i < d; i++) qh[i] = bf16_products(q[b * q_stride + h * d + i], rounded);
            float top = -INFINITY, total = 0.0f;
            for (int64_t j = 0; j < n; j++) {
                const int64_t key = (kv_slots[b * stride + j] * kv_heads + kv) * d;
                float s = 0.0f;
                for (int64_t i = 0; i < d; i++) s += qh[i] * read_kv(k_pool, key + i, kv_bf16);
                scores[j] = s * scale;
                top = fmaxf(top, scores[j]);
            }
            for (int64_t j = 0; j < n; j++) {
                const float e = expf(scores[j] - top);
                total += e;
                scores[j] = bf16_products(e, rounded);
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

int store_new_kv_ref(const float *k, int64_t k_stride, const float *v, int64_t v_stride, const int64_t *out_slots,
                     int64_t tokens, void *k_pool, void *v_pool, int64_t slots, int kv_bf16, int64_t kv_heads,
                     int64_t d) {
    const int invalid = check_new_kv(out_slots, tokens, slots, kv_heads, d);
    if (invalid) return invalid;
    const int64_t row = kv_heads * d;
    for (int64_t t = 0; t < tokens; t++) {
        store_kv_plain(k_pool, out_slots[t] * row, k + t * k_stride, row, kv_bf16);
        store_kv_plain(v_pool, out_slots[t] * row, v + t * v_stride, row, kv_bf16);
    }
    return KERNELS_OK;
}

#if defined(KERNELS_AVX512) || defined(KERNELS_AVX256)

#if defined(KERNELS_AVX512)
#define QUERIES 4  // query heads that share each key vector loaded (registers: 4 x 4 sums)
#define CHUNKS 4   // vectors of a row of values added at once (registers: 4 keys x 4)
// WIDTH values of a pool row (fp32, or bf16 widened) starting at element `at`.
static inline VecF load_kv(const void *pool, int64_t at, int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)pool + at);
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)pool + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
static inline void store_bf16(uint16_t *to, VecF x) { _mm256_storeu_si256((__m256i *)to, round_to_bf16_512(x)); }
#else
#define QUERIES 3  // 16 registers: 3 x 4 sums and 3 query vectors; each key vector is an fma's memory operand
#define CHUNKS 2   // 4 keys x 2
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
    for (int64_t byte = 0; byte < d * (bf16 ? 2 : 4); byte += 64) _mm_prefetch(first + byte, _MM_HINT_T1);
}

#define KEYS 4    // keys dotted at once: independent chains of fmas, reduced together by sum4

// The scaled dots of `nq` query heads (d apart from q) with the KEYS keys at pool[rows[u] + offset ..], into
// out[a * out_stride + u]. Each key vector is loaded (and widened) once for all nq heads. Called with a
// literal nq (dot_keys_of, dot_key_runs_of), so that the loops over heads unroll into registers.
static inline __attribute__((always_inline)) void dot_keys(const int nq, const float *q, const void *pool,
                                                           const int64_t *rows, int64_t offset, int64_t d, int bf16,
                                                           float scale, float *out, int64_t out_stride) {
    VecF acc[QUERIES][KEYS];
    for (int a = 0; a < nq; a++)
        for (int u = 0; u < KEYS; u++) acc[a][u] = vec_zero();
    for (int64_t i = 0; i < d; i += WIDTH) {
        VecF x[QUERIES];
        for (int a = 0; a < nq; a++) x[a] = vec_load(q + a * d + i);
        for (int u = 0; u < KEYS; u++) {
            const VecF key = load_kv(pool, rows[u] + offset + i, bf16);
            for (int a = 0; a < nq; a++) acc[a][u] = vec_fmadd(x[a], key, acc[a][u]);
        }
    }
    for (int a = 0; a < nq; a++)
        _mm_storeu_ps(out + a * out_stride,
                      _mm_mul_ps(sum4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]), _mm_set1_ps(scale)));
}

typedef void (*DotKeys)(const float *, const void *, const int64_t *, int64_t, int64_t, int, float, float *, int64_t);
#define DOT_KEYS(NQ)                                                                                                 \
    static void dot_keys_##NQ(const float *q, const void *pool, const int64_t *rows, int64_t offset, int64_t d,     \
                              int bf16, float scale, float *out, int64_t out_stride) {                              \
        dot_keys(NQ, q, pool, rows, offset, d, bf16, scale, out, out_stride);                                      \
    }
DOT_KEYS(1)
DOT_KEYS(2)
DOT_KEYS(3)
#if QUERIES == 4
DOT_KEYS(4)
static const DotKeys dot_keys_of[QUERIES + 1] = {NULL, dot_keys_1, dot_keys_2, dot_keys_3, dot_keys_4};
#else
static const DotKeys dot_keys_of[QUERIES + 1] = {NULL, dot_keys_1, dot_keys_2, dot_keys_3};
#endif

// A task's query rows per KV head cut into calls of at most QUERIES rows (dot_keys, add_block_values), as even as
// they go: the first `longer` calls take base + 1 rows, the others base. Four rows go as 2 and 2, not 3 and 1: a
// call for one row widens each key for it alone. Made once a task, outside its loops over the keys.
typedef struct {
    int64_t calls, base, longer;
} RowSplit;

static inline RowSplit split_rows(int64_t rows) {
    const int64_t calls = (rows + QUERIES - 1) / QUERIES;
    return (RowSplit){calls, rows / calls, rows % calls};
}

static inline int64_t call_rows(RowSplit split, int64_t call) { return split.base + (call < split.longer); }

// sums[r * d + i ..] (query head r = h * group + a) += the weights of `keys` keys (weights[r * ck + u])
// times their values, pool[rows[u] + h * d + i ..], for every KV head h of a row and `chunks` vectors
// of dimensions from i: the keys' rows are read in order, each value vector loaded once for its query
// heads, the sums kept in L1 (a whole row's heads do not fit the registers). Called with literal keys
// and chunks: add_values_block, add_values_tail.
static inline __attribute__((always_inline)) void add_values(const int keys, const int chunks, const float *weights,
                                                             int64_t ck, int64_t group, int64_t kv_heads,
                                                             const void *pool, const int64_t *rows, int64_t i, int bf16,
                                                             int64_t d, float *sums) {
    for (int64_t h = 0; h < kv_heads; h++) {
        VecF value[KEYS][CHUNKS];
        for (int u = 0; u < keys; u++)
            for (int c = 0; c < chunks; c++) value[u][c] = load_kv(pool, rows[u] + h * d + i + c * WIDTH, bf16);
        for (int64_t a = 0; a < group; a++) {
            const int64_t r = h * group + a;
            VecF weight[KEYS];
            for (int u = 0; u < keys; u++) weight[u] = vec_set1(weights[r * ck + u]);
            for (int c = 0; c < chunks; c++) {
                float *at = sums + r * d + i + c * WIDTH;
                VecF acc = vec_load(at);
                for (int u = 0; u < keys; u++) acc = vec_fmadd(weight[u], value[u][c], acc);
                vec_store(at, acc);
            }
        }
    }
}

static void add_values_block(const float *weights, int64_t ck, int64_t group, int64_t kv_heads, const void *pool,
                             const int64_t *rows, int64_t i, int bf16, int64_t d, float *sums) {
    add_values(KEYS, CHUNKS, weights, ck, group, kv_heads, pool, rows, i, bf16, d, sums);
}

// Fewer than KEYS keys or CHUNKS vectors of dimensions: the same sums, a key and a vector at a time.
static void add_values_tail(int64_t keys, int64_t chunks, const float *weights, int64_t ck, int64_t group,
                            int64_t kv_heads, const void *pool, const int64_t *rows, int64_t i, int bf16, int64_t d,
                            float *sums) {
    for (int64_t u = 0; u < keys; u++)
        for (int64_t c = 0; c < chunks; c++)
            add_values(1, 1, weights + u, ck, group, kv_heads, pool, rows + u, i + c * WIDTH, bf16, d, sums);
}

// Where a task has at least STAGED_ROWS query rows per KV head (a group's shared chunk), it takes its keys and
// values a KV head at a time, widened once to fp32 into the thread's buffers (exact), instead of widening each
// key vector again for every few query rows and keeping the value sums in memory between blocks of keys: the
// sums then stay in registers over all the chunk's keys (add_staged_values). The arithmetic is the same,
// each sum's terms in the same order: a member's output is the same bits in a group as alone. Timed with
// python -m benchmarks.decode_attention (docs/benchmarks/session33-spr/attention_ab.py against a commit).
// With 256-bit registers the staged sums hold a few rows of 32 values, and reading a whole chunk's staged values
// again for every few rows cost more than the widening saved (docs/benchmarks/session33-spr/notes.md; 0.75x on
// Zen 3, docs/benchmarks/session50-amd/notes.md): those builds widen a block of keys at a time (attend_staged).
#if defined(KERNELS_AVX512)
#define STAGED_ROWS 8
// The floats of a thread's buffers for staged keys and for staged values: the widest chunk's.
#define STAGED_KEY_FLOATS(d, widest) ((d) * (widest))
#define STAGED_VALUE_FLOATS(d, widest) ((d) * (widest))
#else
// From 2 calls' rows a head: one request of a model with 4 query heads a KV head ran 0.9x through the blocks
// (docs/benchmarks/session50-amd/notes.md).
#define STAGED_ROWS (2 * QUERIES)
#define VALUE_BLOCK 16  // keys whose values attend_staged widens at once
#define STAGED_KEY_FLOATS(d, widest) ((d) * KEYS)
#define STAGED_VALUE_FLOATS(d, widest) ((d) * VALUE_BLOCK)
#endif

// Head h's d values of the n rows (pool element offsets rows[j]) as fp32, n x d from `to`. The first head's
// pass asks for the keys ahead whole (`heads` x d values), so that the rows come in in order and the
// passes over the other heads find them in L2.
static void stage_head(const void *pool, const int64_t *rows, int64_t n, int64_t h, int64_t heads, int64_t d,
                       int bf16, float *to) {
    for (int64_t j = 0; j < n; j++) {
        if (h == 0 && j + AHEAD < n) prefetch_kv(pool, rows[j + AHEAD], heads * d, bf16);
        for (int64_t i = 0; i < d; i += WIDTH) vec_store(to + j * d + i, load_kv(pool, rows[j] + h * d + i, bf16));
    }
}

#if !defined(KERNELS_AVX512)
// dot_keys for a task's query rows of a head (d apart from q, cut into calls by `split`) with the KEYS staged fp32
// keys at `keys` (d apart), into out[r * out_stride ..]: one call for a block of keys.
static void dot_rows_block(const float *q, RowSplit split, const float *keys, int64_t d, float scale, float *out,
                           int64_t out_stride) {
    const int64_t at[KEYS] = {0, d, 2 * d, 3 * d};
    _Static_assert(QUERIES == 3, "dot_rows_block and add_values_rows name each row count");
    for (int64_t c = 0, r = 0, nq; c < split.calls; c++, r += nq) {
        nq = call_rows(split, c);
        const float *qr = q + r * d;
        float *to = out + r * out_stride;
        if (nq == 3)
            dot_keys(3, qr, keys, at, 0, d, 0, scale, to, out_stride);
        else if (nq == 2)
            dot_keys(2, qr, keys, at, 0, d, 0, scale, to, out_stride);
        else
            dot_keys(1, qr, keys, at, 0, d, 0, scale, to, out_stride);
    }
}

// sums[a * d ..] (a < nr, nc vectors of dimensions) += weights[a * ck + u] times values[u * d ..] (fp32, staged)
// over the n keys in order, the sums in registers over them: add_values' terms in add_values' order. Called with
// a literal nr and nc.
static inline __attribute__((always_inline)) void add_block_values(const int nr, const int nc, const float *weights,
                                                                   int64_t ck, const float *values, int64_t n,
                                                                   int64_t d, float *sums) {
    VecF acc[QUERIES][4];
    for (int a = 0; a < nr; a++)
        for (int c = 0; c < nc; c++) acc[a][c] = vec_load(sums + a * d + c * WIDTH);
    for (int64_t u = 0; u < n; u++)
        for (int a = 0; a < nr; a++) {
            const VecF weight = vec_set1(weights[a * ck + u]);
            for (int c = 0; c < nc; c++) acc[a][c] = vec_fmadd(weight, vec_load(values + u * d + c * WIDTH), acc[a][c]);
        }
    for (int a = 0; a < nr; a++)
        for (int c = 0; c < nc; c++) vec_store(sums + a * d + c * WIDTH, acc[a][c]);
}

// sums[r * d ..] (a task's rows of a head, cut into calls by `split`) += the weights of the n staged keys
// (weights[r * ck + u]) times their values, 4 vectors of dimensions at a time where there are as many.
static void add_values_rows(const float *weights, int64_t ck, RowSplit split, const float *values, int64_t n,
                            int64_t d, float *sums) {
    for (int64_t c = 0, r = 0, nr; c < split.calls; c++, r += nr) {
        nr = call_rows(split, c);
        const float *w = weights + r * ck;
        float *s = sums + r * d;
        for (int64_t i = 0; i + 4 * WIDTH <= d; i += 4 * WIDTH) {
            if (nr == 3)
                add_block_values(3, 4, w, ck, values + i, n, d, s + i);
            else if (nr == 2)
                add_block_values(2, 4, w, ck, values + i, n, d, s + i);
            else
                add_block_values(1, 4, w, ck, values + i, n, d, s + i);
        }
        for (int64_t i = d / (4 * WIDTH) * (4 * WIDTH); i < d; i += WIDTH)
            for (int64_t a = 0; a < nr; a++) add_block_values(1, 1, w + a * ck, ck, values + i, n, d, s + a * d + i);
    }
}
#endif

#if defined(KERNELS_AVX512)
// dot_keys over `blocks` x KEYS keys (rows[j], into out[a * out_stride + j]) in one call: a call for one block
// spends about as much on its entry as on its fmas.
typedef void (*DotKeyRuns)(const float *, const void *, const int64_t *, int64_t, int64_t, int, float, float *,
                           int64_t, int64_t);
#define DOT_KEY_RUNS(NQ)                                                                                             \
    static void dot_key_runs_##NQ(const float *q, const void *pool, const int64_t *rows, int64_t offset, int64_t d, \
                                  int bf16, float scale, float *out, int64_t out_stride, int64_t blocks) {          \
        for (int64_t j = 0; j < blocks * KEYS; j += KEYS)                                                          \
            dot_keys(NQ, q, pool, rows + j, offset, d, bf16, scale, out + j, out_stride);                           \
    }
DOT_KEY_RUNS(1)
DOT_KEY_RUNS(2)
DOT_KEY_RUNS(3)
DOT_KEY_RUNS(4)
static const DotKeyRuns dot_key_runs_of[QUERIES + 1] = {NULL, dot_key_runs_1, dot_key_runs_2, dot_key_runs_3,
                                                        dot_key_runs_4};

// sums[a * d ..] (a < nr <= QUERIES) = the sum over the n keys, in order, of weights[a * ck + j] times
// values[j * d ..] (fp32, staged), each sum from zero. Called with a literal nr (add_staged_of).
static inline __attribute__((always_inline)) void add_staged_values(const int nr, const float *weights, int64_t ck,
                                                                    const float *values, int64_t n, int64_t d,
                                                                    float *sums) {
    for (int64_t i = 0; i < d; i += CHUNKS * WIDTH) {
        const int64_t chunks = (d - i) / WIDTH < CHUNKS ? (d - i) / WIDTH : CHUNKS;
        VecF acc[QUERIES][CHUNKS];
        for (int a = 0; a < nr; a++)
            for (int c = 0; c < CHUNKS; c++) acc[a][c] = vec_zero();
        for (int64_t j = 0; j < n; j++) {
            VecF value[CHUNKS];
            for (int c = 0; c < CHUNKS; c++) value[c] = c < chunks ? vec_load(values + j * d + i + c * WIDTH) : vec_zero();
            for (int a = 0; a < nr; a++) {
                const VecF weight = vec_set1(weights[a * ck + j]);
                for (int c = 0; c < CHUNKS; c++) acc[a][c] = vec_fmadd(weight, value[c], acc[a][c]);
            }
        }
        for (int a = 0; a < nr; a++)
            for (int c = 0; c < chunks; c++) vec_store(sums + a * d + i + c * WIDTH, acc[a][c]);
    }
}

typedef void (*AddStaged)(const float *, int64_t, const float *, int64_t, int64_t, float *);
#define ADD_STAGED(NR)                                                                                         \
    static void add_staged_values_##NR(const float *weights, int64_t ck, const float *values, int64_t n,     \
                                       int64_t d, float *sums) {                                            \
        add_staged_values(NR, weights, ck, values, n, d, sums);                                             \
    }
ADD_STAGED(1)
ADD_STAGED(2)
ADD_STAGED(3)
ADD_STAGED(4)
static const AddStaged add_staged_of[QUERIES + 1] = {NULL, add_staged_values_1, add_staged_values_2,
                                                     add_staged_values_3, add_staged_values_4};

// The bf16 products (bf16_products) on AVX-512 BF16: a task's queries rounded once into rows of
// padded_dim(d) bf16 values (zeros past d), the keys dotted where they lie in the pool, 32 dimensions a
// vdpbf16ps, each key vector loaded once for QUERIES query rows; the weights rounded to bf16 and the values
// taken two keys at a time, each dimension's two side by side (interleave_rows), against the pair of the
// keys' weights. Against the fp32 products this halves the multiplies and drops the widening of every key
// and value vector.
static void round_queries(const float *q, int64_t rows, int64_t d, uint16_t *to) {
    const int64_t dp = padded_dim(d);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < dp; i += WIDTH)
            _mm256_storeu_si256((__m256i *)(to + r * dp + i),
                                i < d ? round_to_bf16_512(vec_load(q + r * d + i)) : _mm256_setzero_si256());
}

// A row's n weights rounded to bf16, and a zero after an odd count (the pair of the last key).
static void round_weights(const float *weights, int64_t n, uint16_t *to) {
    int64_t j = 0;
    for (; j + WIDTH <= n; j += WIDTH) _mm256_storeu_si256((__m256i *)(to + j), round_to_bf16_512(vec_load(weights + j)));
    for (; j < n; j++) to[j] = bf16_of(weights[j]);
    if (n % 2) to[n] = 0;
}

// A pair of a row's bf16 weights (keys j, j + 1; j even) in every 32-bit lane.
BF16 static inline __m512bh weight_pair(const uint16_t *weights) {
    int32_t pair;
    memcpy(&pair, weights, sizeof pair);
    return (__m512bh)_mm512_set1_epi32(pair);
}

// dot_keys for `blocks` x KEYS keys, bf16 queries (`q`: nq rows of padded_dim(d)).
BF16 static inline __attribute__((always_inline)) void dot_keys_bf16(const int nq, const uint16_t *q,
                                                                    const uint16_t *pool, const int64_t *rows,
                                                                    int64_t offset, int64_t d, float scale,
                                                                    float *out, int64_t out_stride, int64_t blocks) {
    const int64_t dp = padded_dim(d);
    for (int64_t j = 0; j < blocks * KEYS; j += KEYS) {
        __m512 acc[QUERIES][KEYS];
        for (int a = 0; a < nq; a++)
            for (int u = 0; u < KEYS; u++) acc[a][u] = vec_zero();
        for (int64_t i = 0; i < d; i += 32) {
            const __mmask32 in = d - i >= 32 ? 0xFFFFFFFFu : 0xFFFFu;
            __m512bh x[QUERIES];
            for (int a = 0; a < nq; a++) x[a] = (__m512bh)_mm512_loadu_si512(q + a * dp + i);
            for (int u = 0; u < KEYS; u++) {
                const __m512bh key = (__m512bh)_mm512_maskz_loadu_epi16(in, pool + rows[j + u] + offset + i);
                for (int a = 0; a < nq; a++) acc[a][u] = _mm512_dpbf16_ps(acc[a][u], x[a], key);
            }
        }
        for (int a = 0; a < nq; a++)
            _mm_storeu_ps(out + a * out_stride + j,
                          _mm_mul_ps(sum4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]), _mm_set1_ps(scale)));
    }
}

typedef void (*DotKeysBf16)(const uint16_t *, const uint16_t *, const int64_t *, int64_t, int64_t, float, float *,
                            int64_t, int64_t);
#define DOT_KEYS_BF16(NQ)                                                                                         \
    BF16 static void dot_keys_bf16_##NQ(const uint16_t *q, const uint16_t *pool, const int64_t *rows,           \
                                        int64_t offset, int64_t d, float scale, float *out, int64_t out_stride, \
                                        int64_t blocks) {                                                       \
        dot_keys_bf16(NQ, q, pool, rows, offset, d, scale, out, out_stride, blocks);                              \
    }
DOT_KEYS_BF16(1)
DOT_KEYS_BF16(2)
DOT_KEYS_BF16(3)
DOT_KEYS_BF16(4)
static const DotKeysBf16 dot_keys_bf16_of[QUERIES + 1] = {NULL, dot_keys_bf16_1, dot_keys_bf16_2, dot_keys_bf16_3,
                                                          dot_keys_bf16_4};

// add_values with bf16 products: `pairs` pairs of keys (`keys` of them, 2 x pairs or one fewer: the last
// one's pair is zeros), weights[r * ck + 2p ..] the pair of row r.
BF16 static inline __attribute__((always_inline)) void add_values_bf16(const int pairs, const int chunks,
                                                                      const uint16_t *weights, int64_t ck,
                                                                      int64_t group, int64_t kv_heads,
                                                                      const uint16_t *pool, const int64_t *rows,
                                                                      int64_t keys, int64_t i, int64_t d,
                                                                      float *sums) {
    for (int64_t h = 0; h < kv_heads; h++) {
        __m512bh value[KEYS / 2][CHUNKS];
        for (int p = 0; p < pairs; p++)
            for (int c = 0; c < chunks; c++) {
                const uint16_t *at = pool + h * d + i + c * WIDTH;
                const __m256i first = _mm256_loadu_si256((const __m256i *)(at + rows[2 * p]));
                const __m256i second =
                    2 * p + 1 < keys ? _mm256_loadu_si256((const __m256i *)(at + rows[2 * p + 1])) : _mm256_setzero_si256();
                value[p][c] = (__m512bh)interleave_rows(first, second);
            }
        for (int64_t a = 0; a < group; a++) {
            const int64_t r = h * group + a;
            __m512bh weight[KEYS / 2];
            for (int p = 0; p < pairs; p++) weight[p] = weight_pair(weights + r * ck + 2 * p);
            for (int c = 0; c < chunks; c++) {
                float *at = sums + r * d + i + c * WIDTH;
                __m512 acc = vec_load(at);
                for (int p = 0; p < pairs; p++) acc = _mm512_dpbf16_ps(acc, weight[p], value[p][c]);
                vec_store(at, acc);
            }
        }
    }
}

BF16 static void add_values_bf16_block(const uint16_t *weights, int64_t ck, int64_t group, int64_t kv_heads,
                                       const uint16_t *pool, const int64_t *rows, int64_t i, int64_t d, float *sums) {
    add_values_bf16(KEYS / 2, CHUNKS, weights, ck, group, kv_heads, pool, rows, KEYS, i, d, sums);
}

// Fewer than KEYS keys or CHUNKS vectors of dimensions: the same sums, a pair and a vector at a time.
BF16 static void add_values_bf16_tail(int64_t keys, int64_t chunks, const uint16_t *weights, int64_t ck,
                                      int64_t group, int64_t kv_heads, const uint16_t *pool, const int64_t *rows,
                                      int64_t i, int64_t d, float *sums) {
    for (int64_t u = 0; u < keys; u += 2)
        for (int64_t c = 0; c < chunks; c++)
            add_values_bf16(1, 1, weights + u, ck, group, kv_heads, pool, rows + u, keys - u, i + c * WIDTH, d, sums);
}

// Head h's values of the n rows, each pair of keys' interleaved (interleave_rows), (n + 1) / 2 pairs x 2d
// from `to`; the first head's pass asks for the keys' and the values' rows ahead whole, as stage_head's.
static void stage_value_pairs(const uint16_t *k_pool, const uint16_t *v_pool, const int64_t *rows, int64_t n,
                              int64_t h, int64_t heads, int64_t d, uint16_t *to) {
    for (int64_t j = 0; j < n; j += 2) {
        if (h == 0)
            for (int64_t w = j + AHEAD; w < j + AHEAD + 2 && w < n; w++) {
                prefetch_kv(k_pool, rows[w], heads * d, 1);
                prefetch_kv(v_pool, rows[w], heads * d, 1);
            }
        const uint16_t *first = v_pool + rows[j] + h * d, *second = v_pool + rows[j + 1 < n ? j + 1 : j] + h * d;
        for (int64_t i = 0; i < d; i += WIDTH) {
            const __m256i low = _mm256_loadu_si256((const __m256i *)(first + i));
            const __m256i high = j + 1 < n ? _mm256_loadu_si256((const __m256i *)(second + i)) : _mm256_setzero_si256();
            _mm512_storeu_si512(to + (j / 2 * d + i) * 2, interleave_rows(low, high));
        }
    }
}

// add_staged_values with bf16 products: `pairs` staged pairs (stage_value_pairs), weights[a * ck + 2m ..].
BF16 static inline __attribute__((always_inline)) void add_staged_bf16(const int nr, const uint16_t *weights,
                                                                      int64_t ck, const uint16_t *values,
                                                                      int64_t pairs, int64_t d, float *sums) {
    for (int64_t i = 0; i < d; i += CHUNKS * WIDTH) {
        const int64_t chunks = (d - i) / WIDTH < CHUNKS ? (d - i) / WIDTH : CHUNKS;
        __m512 acc[QUERIES][CHUNKS];
        for (int a = 0; a < nr; a++)
            for (int c = 0; c < CHUNKS; c++) acc[a][c] = vec_zero();
        for (int64_t m = 0; m < pairs; m++) {
            __m512bh value[CHUNKS];
            for (int c = 0; c < CHUNKS; c++)
                value[c] = (__m512bh)(c < chunks ? _mm512_loadu_si512(values + (m * d + i + c * WIDTH) * 2)
                                                 : _mm512_setzero_si512());
            for (int a = 0; a < nr; a++) {
                const __m512bh weight = weight_pair(weights + a * ck + 2 * m);
                for (int c = 0; c < CHUNKS; c++) acc[a][c] = _mm512_dpbf16_ps(acc[a][c], weight, value[c]);
            }
        }
        for (int a = 0; a < nr; a++)
            for (int c = 0; c < chunks; c++) vec_store(sums + a * d + i + c * WIDTH, acc[a][c]);
    }
}

typedef void (*AddStagedBf16)(const uint16_t *, int64_t, const uint16_t *, int64_t, int64_t, float *);
#define ADD_STAGED_BF16(NR)                                                                                    \
    BF16 static void add_staged_bf16_##NR(const uint16_t *weights, int64_t ck, const uint16_t *values,       \
                                          int64_t pairs, int64_t d, float *sums) {                          \
        add_staged_bf16(NR, weights, ck, values, pairs, d, sums);                                           \
    }
ADD_STAGED_BF16(1)
ADD_STAGED_BF16(2)
ADD_STAGED_BF16(3)
ADD_STAGED_BF16(4)
static const AddStagedBf16 add_staged_bf16_of[QUERIES + 1] = {NULL, add_staged_bf16_1, add_staged_bf16_2,
                                                              add_staged_bf16_3, add_staged_bf16_4};
#endif  // KERNELS_AVX512

// A task is a chunk of a request's keys, whole rows (every KV head) of each. A chunk's rows stay in L2
// while its passes read them; the chunks' partial sums are merged after. A request gets about SPLIT
// chunks, so that one long request still spreads over the threads, of MIN_CHUNK_BYTES to CHUNK_BYTES of
// rows (smaller chunks were slower for many short requests with short rows: each task's first keys
// come in unprefetched; benchmarks.decode_attention). A group shares only the whole chunks inside its common
// prompt: 96 KiB is 256 keys of 135M's 384-byte rows, so that 32 requests after a 512-token system prompt
// share all of it (on the 2-core Sapphire Rapids VM, amx build: 1.11-1.14x there against 128 KiB's 340 keys;
// 0.96x for 16 requests of 288 keys, which now take two chunks: docs/benchmarks/session39-spr/
// attention_chunks.txt). The chunks follow from the model and
// the request alone, never the batch: a request's sums run in the same order alone as in a batch.
#define CHUNK_BYTES (256 * 1024)
#define MIN_CHUNK_BYTES (96 * 1024)
#define SPLIT 8
static int64_t chunk_keys(int64_t n, int64_t row_bytes) {
    const int64_t most = CHUNK_BYTES / row_bytes, least = MIN_CHUNK_BYTES / row_bytes, wanted = (n + SPLIT - 1) / SPLIT;
    int64_t keys = wanted < least ? least : wanted;
    keys = (keys < most ? keys : most) / KEYS * KEYS;
    return keys > KEYS ? keys : KEYS;
}

// A request's chunks of `keys`: one at least, so that one without keys still gets its (zero) output.
static int64_t chunk_count(int64_t n, int64_t keys) { return n > keys ? (n + keys - 1) / keys : 1; }

// Where a batch has fewer chunks than two a thread (one short request), each chunk's KV heads are split
// into this many blocks, a task each, so that every thread has work: a head's sums are the same whichever
// task computes them. A divisor of kv_heads.
static int64_t head_blocks(int64_t kv_heads, int64_t chunks, int threads) {
    if (chunks < 1) return 1;  // an empty batch
    const int64_t wanted = (2 * threads + chunks - 1) / chunks;
    int64_t blocks = wanted < kv_heads ? wanted : kv_heads;
    while (kv_heads % blocks) blocks++;
    return blocks;
}

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

// A task: the n keys of a chunk (rows: each one's pool offset at the task's first KV head, padded to a whole
// block of KEYS with key 0's), per_task KV heads of rows_per_head query rows each, ck apart in the scores;
// each row's unnormalised sums, largest score and total into sums, top and total.
typedef struct {
    const void *k_pool, *v_pool;
    const int64_t *rows;
    int64_t n, ck, per_task, rows_per_head, d;
    float scale;
    float *sums, *top, *total;
} Task;

// A thread's buffers: scores ([rows of a task, widest]), staged keys and values (fp32: STAGED_KEY_FLOATS and
// STAGED_VALUE_FLOATS; bf16 products stage their value pairs in the keys' part), a group's query rows ([rows,
// d]: gather_queries), row offsets and staged keys' offsets ([widest] each), and for bf16 products the rounded
// queries ([rows, padded_dim(d)]) and weights ([rows, widest]).
typedef struct {
    float *scores, *staged_keys, *staged_values, *group_queries;
    int64_t *rows, *staged_rows;
    uint16_t *queries, *weights;
} Buffers;

// Rows r0 .. r1's softmax numerators over their n scores in place, and each row's largest score and total.
static void weigh_rows(float *scores, int64_t ck, int64_t r0, int64_t r1, int64_t n, float *top, float *total) {
    for (int64_t r = r0; r < r1; r++) {
        top[r] = largest(scores + r * ck, n);
        total[r] = exponentiate(scores + r * ck, n, top[r]);
    }
}

// A task of STAGED_ROWS query rows a KV head or more with fp32 products: its keys and values widened to fp32 once
// for all its rows, each row's arithmetic attend_fp32's.
#if defined(KERNELS_AVX512)
// A KV head at a time: its keys and values staged, then its rows' scores, weights and sums.
static void attend_staged(const Task *t, const float *q, int kv_bf16, const Buffers *buf) {
    const int64_t n = t->n, ck = t->ck, d = t->d, per_task = t->per_task, rows_per_head = t->rows_per_head;
    const int64_t keys = (n + KEYS - 1) / KEYS * KEYS;
    float *scores = buf->scores;
    for (int64_t j = 0; j < keys; j++) buf->staged_rows[j] = (j < n ? j : 0) * d;
    for (int64_t h = 0; h < per_task; h++) {
        stage_head(t->k_pool, t->rows, n, h, per_task, d, kv_bf16, buf->staged_keys);
        stage_head(t->v_pool, t->rows, n, h, per_task, d, kv_bf16, buf->staged_values);
        for (int64_t g = 0; g < rows_per_head; g += QUERIES) {
            const int64_t nq = rows_per_head - g < QUERIES ? rows_per_head - g : QUERIES;
            const int64_t r = h * rows_per_head + g;
            dot_key_runs_of[nq](q + r * d, buf->staged_keys, buf->staged_rows, 0, d, 0, t->scale, scores + r * ck, ck,
                                keys / KEYS);
        }
        weigh_rows(scores, ck, h * rows_per_head, (h + 1) * rows_per_head, n, t->top, t->total);
        for (int64_t g = 0; g < rows_per_head; g += QUERIES) {
            const int64_t nr = rows_per_head - g < QUERIES ? rows_per_head - g : QUERIES;
            const int64_t r = h * rows_per_head + g;
            add_staged_of[nr](scores + r * ck, ck, buf->staged_values, n, d, t->sums + r * d);
        }
    }
}
#else
// KEYS keys of a head at a time widened and dotted with all its rows, then VALUE_BLOCK keys' values at a time added
// to all its rows' sums (in registers over the block).
static void attend_staged(const Task *t, const float *q, int kv_bf16, const Buffers *buf) {
    const int64_t n = t->n, ck = t->ck, d = t->d, per_task = t->per_task, rows_per_head = t->rows_per_head;
    const int64_t keys = (n + KEYS - 1) / KEYS * KEYS, task_rows = per_task * rows_per_head;
    const int64_t *rows = t->rows;
    const RowSplit split = split_rows(rows_per_head);
    float *scores = buf->scores, *staged = buf->staged_keys;
    for (int64_t j = 0; j < keys; j += KEYS) {
        for (int64_t h = 0; h < per_task; h++) {
            for (int64_t w = j + AHEAD; w < j + AHEAD + KEYS && w < n; w++) {
                prefetch_kv(t->k_pool, rows[w] + h * d, d, kv_bf16);
                prefetch_kv(t->v_pool, rows[w] + h * d, d, kv_bf16);
            }
            stage_head(t->k_pool, rows + j, KEYS, h, per_task, d, kv_bf16, staged);
            const int64_t r = h * rows_per_head;
            dot_rows_block(q + r * d, split, staged, d, t->scale, scores + r * ck + j, ck);
        }
    }
    weigh_rows(scores, ck, 0, task_rows, n, t->top, t->total);
    memset(t->sums, 0, sizeof(float) * (size_t)(task_rows * d));
    staged = buf->staged_values;
    for (int64_t j = 0; j < n; j += VALUE_BLOCK) {
        const int64_t block = n - j < VALUE_BLOCK ? n - j : VALUE_BLOCK;
        for (int64_t h = 0; h < per_task; h++) {
            stage_head(t->v_pool, rows + j, block, h, per_task, d, kv_bf16, staged);
            const int64_t r = h * rows_per_head;
            add_values_rows(scores + r * ck + j, ck, split, staged, block, d, t->sums + r * d);
        }
    }
}
#endif

// A task with fp32 products.
static void attend_fp32(const Task *t, const float *q, int kv_bf16, const Buffers *buf) {
    const int64_t n = t->n, ck = t->ck, d = t->d, per_task = t->per_task, rows_per_head = t->rows_per_head;
    const int64_t keys = (n + KEYS - 1) / KEYS * KEYS, task_rows = per_task * rows_per_head;
    const int64_t *rows = t->rows;
    float *scores = buf->scores, *sums = t->sums;
    if (rows_per_head >= STAGED_ROWS) {
        attend_staged(t, q, kv_bf16, buf);
        return;
    }
    const RowSplit split = split_rows(rows_per_head);
    // Keys: KEYS keys' rows, head after head. The keys AHEAD further are asked for a head at a time, spread
    // over the pass, with their values for the pass over them that follows.
    for (int64_t j = 0; j < keys; j += KEYS) {
        for (int64_t h = 0; h < per_task; h++) {
            for (int64_t w = j + AHEAD; w < j + AHEAD + KEYS && w < n; w++) {
                prefetch_kv(t->k_pool, rows[w] + h * d, d, kv_bf16);
                prefetch_kv(t->v_pool, rows[w] + h * d, d, kv_bf16);
            }
            for (int64_t c = 0, g = 0, nq; c < split.calls; c++, g += nq) {
                nq = call_rows(split, c);
                const int64_t r = h * rows_per_head + g;
                dot_keys_of[nq](q + r * d, t->k_pool, rows + j, h * d, d, kv_bf16, t->scale, scores + r * ck + j, ck);
            }
        }
    }
    weigh_rows(scores, ck, 0, task_rows, n, t->top, t->total);
    // Values: KEYS keys' rows at a time, CHUNKS vectors of dimensions of every head a pass.
    memset(sums, 0, sizeof(float) * (size_t)(task_rows * d));
    for (int64_t j = 0; j < n; j += KEYS) {
        const int64_t block = n - j < KEYS ? n - j : KEYS;
        for (int64_t i = 0; i < d; i += CHUNKS * WIDTH) {
            const int64_t chunks = (d - i) / WIDTH < CHUNKS ? (d - i) / WIDTH : CHUNKS;
            if (block == KEYS && chunks == CHUNKS)
                add_values_block(scores + j, ck, rows_per_head, per_task, t->v_pool, rows + j, i, kv_bf16, d, sums);
            else
                add_values_tail(block, chunks, scores + j, ck, rows_per_head, per_task, t->v_pool, rows + j, i,
                                kv_bf16, d, sums);
        }
    }
}

#if defined(KERNELS_AVX512)
// A task with bf16 products (queries `q`: round_queries'), laid out as attend_fp32's: a KV head at a time
// where it has STAGED_ROWS query rows a head, its values staged in pairs once for them all (its keys need no
// widening, and are dotted from the pool); else KEYS keys' rows at a time, head after head.
BF16 static void attend_bf16(const Task *t, const uint16_t *q, const Buffers *buf) {
    const int64_t n = t->n, ck = t->ck, d = t->d, per_task = t->per_task, rows_per_head = t->rows_per_head;
    const int64_t keys = (n + KEYS - 1) / KEYS * KEYS, task_rows = per_task * rows_per_head, dp = padded_dim(d);
    const uint16_t *k_pool = t->k_pool, *v_pool = t->v_pool;
    const int64_t *rows = t->rows;
    float *scores = buf->scores, *sums = t->sums;
    uint16_t *weights = buf->weights, *staged = (uint16_t *)buf->staged_keys;
    if (rows_per_head >= STAGED_ROWS) {
        for (int64_t h = 0; h < per_task; h++) {
            stage_value_pairs(k_pool, v_pool, rows, n, h, per_task, d, staged);
            for (int64_t g = 0; g < rows_per_head; g += QUERIES) {
                const int64_t nq = rows_per_head - g < QUERIES ? rows_per_head - g : QUERIES;
                const int64_t r = h * rows_per_head + g;
                dot_keys_bf16_of[nq](q + r * dp, k_pool, rows, h * d, d, t->scale, scores + r * ck, ck, keys / KEYS);
            }
            weigh_rows(scores, ck, h * rows_per_head, (h + 1) * rows_per_head, n, t->top, t->total);
            for (int64_t r = h * rows_per_head; r < (h + 1) * rows_per_head; r++)
                round_weights(scores + r * ck, n, weights + r * ck);
            for (int64_t g = 0; g < rows_per_head; g += QUERIES) {
                const int64_t nr = rows_per_head - g < QUERIES ? rows_per_head - g : QUERIES;
                const int64_t r = h * rows_per_head + g;
                add_staged_bf16_of[nr](weights + r * ck, ck, staged, (n + 1) / 2, d, sums + r * d);
            }
        }
        return;
    }
    for (int64_t j = 0; j < keys; j += KEYS) {
        for (int64_t h = 0; h < per_task; h++) {
            for (int64_t w = j + AHEAD; w < j + AHEAD + KEYS && w < n; w++) {
                prefetch_kv(k_pool, rows[w] + h * d, d, 1);
                prefetch_kv(v_pool, rows[w] + h * d, d, 1);
            }
            for (int64_t g = 0; g < rows_per_head; g += QUERIES) {
                const int64_t nq = rows_per_head - g < QUERIES ? rows_per_head - g : QUERIES;
                const int64_t r = h * rows_per_head + g;
                dot_keys_bf16_of[nq](q + r * dp, k_pool, rows + j, h * d, d, t->scale, scores + r * ck + j, ck, 1);
            }
        }
    }
    weigh_rows(scores, ck, 0, task_rows, n, t->top, t->total);
    for (int64_t r = 0; r < task_rows; r++) round_weights(scores + r * ck, n, weights + r * ck);
    memset(sums, 0, sizeof(float) * (size_t)(task_rows * d));
    for (int64_t j = 0; j < n; j += KEYS) {
        const int64_t block = n - j < KEYS ? n - j : KEYS;
        for (int64_t i = 0; i < d; i += CHUNKS * WIDTH) {
            const int64_t chunks = (d - i) / WIDTH < CHUNKS ? (d - i) / WIDTH : CHUNKS;
            if (block == KEYS && chunks == CHUNKS)
                add_values_bf16_block(weights + j, ck, rows_per_head, per_task, v_pool, rows + j, i, d, sums);
            else
                add_values_bf16_tail(block, chunks, weights + j, ck, rows_per_head, per_task, v_pool, rows + j, i, d,
                                     sums);
        }
    }
}
#endif

// A request's chunking, and its group: requests whose keys begin with the same slots (a prefix the
// radix cache holds once, such as a system prompt) and that cut them into chunks of the same size.
typedef struct {
    int64_t keys, parts;  // chunk_keys and chunk_count of its keys
    int64_t leader;       // its group's first request (itself if it leads one, or is alone)
    int64_t member;       // its place in that group, 0 for the first
    int64_t width;        // a group's first: its members (1 alone)
    int64_t shared;       // a group's first: the whole chunks every member has in the run they share
    int64_t members;      // a group's first, where shared > 0: where its members' indices start in `members`
} Request;

// A unit of work before the split by KV heads: chunk `part` of a request's keys, for its own query
// heads (width 1), or for those of all `width` members of the group it leads, which share that chunk.
typedef struct {
    int64_t request, part, width;
    int64_t row0;  // its first task's first row of partial sums (a task has per_task x width x group)
} Unit;

static int64_t common_run(const int64_t *a, const int64_t *b, int64_t n) {
    int64_t j = 0;
    while (j < n && a[j] == b[j]) j++;
    return j;
}

// The groups among the requests (each req[b] holding its chunking). A shared chunk ends before every
// member's last key, so that each member keeps a chunk of its own, through which its chunks are merged.
static void find_groups(Request *req, const int64_t *kv_slots, int64_t stride, const int64_t *kv_lens,
                        int64_t batch) {
    for (int64_t b = 0; b < batch; b++) {
        const int64_t *row = kv_slots + b * stride;
        for (int64_t lead = 0; lead < b && kv_lens[b] > 1; lead++) {
            Request *first = &req[lead];
            if (first->leader != lead || kv_lens[lead] < 2 || first->keys != req[b].keys ||
                kv_slots[lead * stride] != row[0])
                continue;
            const int64_t shortest = kv_lens[b] < kv_lens[lead] ? kv_lens[b] : kv_lens[lead];
            const int64_t run = common_run(kv_slots + lead * stride, row, shortest - 1);
            req[b].leader = lead, req[b].member = first->width++;
            first->shared = first->width == 2 || run < first->shared ? run : first->shared;  // keys, for now
            break;
        }
    }
    for (int64_t b = 0; b < batch; b++)
        if (req[b].leader == b) req[b].shared = req[b].width > 1 ? req[b].shared / req[b].keys : 0;
}

// A group's query rows for KV heads first .. first + per_task, member after member within each head ([per_task,
// width, group, d]: a task's rows in one run, as a request's lie in q), members[m] the request of member m.
// Gathered by the thread that attends them, into its own buffer, once a task (each of a group's shared chunks
// gathers them again): copied once by the calling thread before the parallel part, they held every task up, the
// copies' lines being the other core's since the layer before (docs/benchmarks/session42-amd/decode_attention_ab.txt).
static void gather_queries(const float *q, int64_t q_stride, const int64_t *members, int64_t width, int64_t group,
                           int64_t first, int64_t per_task, int64_t d, float *to) {
    for (int64_t h = 0; h < per_task; h++)
        for (int64_t m = 0; m < width; m++)
            memcpy(to + (h * width + m) * group * d, q + members[m] * q_stride + (first + h) * group * d,
                   sizeof(float) * (size_t)(group * d));
}

// The partial-sum row of query head h * group + a of request b in its chunk c: in a shared chunk, the
// member's place among its group's rows.
static int64_t chunk_row(const Request *req, const Unit *unit, const int64_t *chunk_unit, int64_t most, int64_t b,
                         int64_t c, int64_t h, int64_t a, int64_t group) {
    const int64_t lead = req[b].leader, shared = c < req[lead].shared;
    const Unit *u = &unit[chunk_unit[(shared ? lead : b) * most + c]];
    return u->row0 + (h * u->width + (shared ? req[b].member : 0)) * group + a;  // its tasks' rows, head after head
}

int paged_decode_attention(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                           int64_t v_stride, const int64_t *out_slots, void *k_pool, void *v_pool, int64_t slots,
                           int kv_bf16, const int64_t *kv_slots, int64_t stride, const int64_t *kv_lens, int64_t batch,
                           int64_t heads, int64_t kv_heads, int64_t d, float scale, float *out, int threads) {
    const int invalid = check_arguments(out_slots, slots, kv_slots, stride, kv_lens, batch, heads, kv_heads, d);
    if (invalid) return invalid;
    const int64_t group = heads / kv_heads, row = kv_heads * d;
    for (int64_t b = 0; b < batch; b++) {
        store_kv(k_pool, out_slots[b] * row, k + b * k_stride, row, kv_bf16);
        store_kv(v_pool, out_slots[b] * row, v + b * v_stride, row, kv_bf16);
    }
    const int64_t row_bytes = row * (kv_bf16 ? 2 : 4);
    static _Thread_local Scratch plan;  // the calling thread's, for its next call
    Request *req = scratch_reserve(&plan, sizeof(Request) * (size_t)(batch + 1));
    if (req == NULL) return KERNELS_NO_MEMORY;
    int64_t most = 0, all_parts = 0, widest = KEYS;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t keys = chunk_keys(kv_lens[b], row_bytes), parts = chunk_count(kv_lens[b], keys);
        req[b] = (Request){keys, parts, b, 0, 1, 0, 0};
        most = parts > most ? parts : most;
        widest = keys > widest ? keys : widest;
        all_parts += parts;
    }
    find_groups(req, kv_slots, stride, kv_lens, batch);
    // The units, chunk outer (requests that share rows read them close together in time), and
    // chunk_unit[b * most + p]: the unit of chunk p of request b (its group's, for a shared chunk).
    // members: the requests of each group that shares chunks, in member order (Request.members).
    static _Thread_local Scratch units_scratch;
    Unit *unit = scratch_reserve(&units_scratch, sizeof(Unit) * (size_t)(all_parts + 1) +
                                                     sizeof(int64_t) * (size_t)(batch * most + batch + 1));
    if (unit == NULL) return KERNELS_NO_MEMORY;
    int64_t *chunk_unit = (int64_t *)(unit + all_parts + 1), *members = chunk_unit + batch * most;
    int64_t listed = 0;
    for (int64_t b = 0; b < batch; b++)
        if (req[b].leader == b && req[b].shared > 0) req[b].members = listed, listed += req[b].width;
    for (int64_t b = 0; b < batch; b++) {
        const Request *first = &req[req[b].leader];
        if (first->shared > 0) members[first->members + req[b].member] = b;
    }
    int64_t units = 0, max_width = 1;
    for (int64_t p = 0; p < most; p++)
        for (int64_t b = 0; b < batch; b++) {
            const Request *first = &req[req[b].leader];
            if (req[b].leader == b && p < first->shared) {
                unit[units] = (Unit){b, p, first->width, 0};
                max_width = first->width > max_width ? first->width : max_width;
            } else if (p >= first->shared && p < req[b].parts) {
                unit[units] = (Unit){b, p, 1, 0};
            } else {
                continue;
            }
            chunk_unit[b * most + p] = units++;
        }
    const int64_t blocks = head_blocks(kv_heads, units, threads), tasks = units * blocks;
    const int64_t per_task = kv_heads / blocks;  // KV heads a task
    int64_t total_rows = 0;
    for (int64_t u = 0; u < units; u++) {
        unit[u].row0 = total_rows;
        total_rows += blocks * per_task * unit[u].width * group;
    }
    // Each task row's unnormalised sums, largest score and total.
    static _Thread_local Scratch partial_scratch;
    float *partial = scratch_reserve(&partial_scratch, sizeof(float) * (size_t)(total_rows * (d + 2) + 1));
    if (partial == NULL) return KERNELS_NO_MEMORY;
    float *tops = partial + total_rows * d, *totals = tops + total_rows;
    const int64_t max_task_rows = per_task * max_width * group;
#if defined(KERNELS_AVX512)
    const int bf16_dots = multiplies_in_bf16(kv_bf16);
#endif
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        // Each thread's buffers (Buffers), in one allocation kept for its next call.
        static _Thread_local Scratch scratch;
        const int64_t score_floats = max_task_rows * widest, stages = max_width * group >= STAGED_ROWS;
        const int64_t staged_key_floats = stages ? STAGED_KEY_FLOATS(d, widest) : 0;
        const int64_t staged_floats = staged_key_floats + (stages ? STAGED_VALUE_FLOATS(d, widest) : 0);
        const int64_t query_values = max_task_rows * padded_dim(d);
        const int64_t group_floats = max_width > 1 ? max_task_rows * d : 0;  // gather_queries'
        const int64_t floats = score_floats + staged_floats + group_floats;
        float *scores = team_reserve(&scratch,
                                     sizeof(float) * (size_t)floats + sizeof(int64_t) * (size_t)(2 * widest) +
                                         sizeof(uint16_t) * (size_t)(query_values + score_floats),
                                     &failed);
        Buffers buffers = {.scores = scores};
        if (scores != NULL) {
            buffers.staged_keys = scores + score_floats;
            buffers.staged_values = buffers.staged_keys + staged_key_floats;
            buffers.group_queries = buffers.staged_keys + staged_floats;
            buffers.rows = (int64_t *)(buffers.group_queries + group_floats);
            buffers.staged_rows = buffers.rows + widest;
            buffers.queries = (uint16_t *)(buffers.staged_rows + widest);
            buffers.weights = buffers.queries + query_values;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; t++) {
            if (scores == NULL) continue;
            const Unit *u = &unit[t / blocks];
            const int64_t b = u->request, ck = req[b].keys, start = u->part * ck;
            const int64_t n = kv_lens[b] - start < ck ? kv_lens[b] - start : ck;
            const int64_t keys = (n + KEYS - 1) / KEYS * KEYS;  // a last partial block dots the chunk's key 0 again
            const int64_t first = t % blocks * per_task;         // its first KV head
            const int64_t rows_per_head = u->width * group, task_rows = per_task * rows_per_head;
            const float *qt = q + b * q_stride + first * group * d;
            if (u->width > 1) {
                gather_queries(q, q_stride, members + req[b].members, u->width, group, first, per_task, d,
                               buffers.group_queries);
                qt = buffers.group_queries;
            }
            const int64_t at = u->row0 + t % blocks * task_rows;
            float *sums = partial + at * d, *top = tops + at, *total = totals + at;
            const int64_t *slots = kv_slots + b * stride + start;
            for (int64_t j = 0; j < keys; j++) buffers.rows[j] = slots[j < n ? j : 0] * row + first * d;
            const Task task = {k_pool, v_pool, buffers.rows, n, ck, per_task, rows_per_head, d, scale, sums, top, total};
#if defined(KERNELS_AVX512)
            if (bf16_dots) {
                round_queries(qt, task_rows, d, buffers.queries);
                attend_bf16(&task, buffers.queries, &buffers);
            } else
#endif
                attend_fp32(&task, qt, kv_bf16, &buffers);
            if (u->width == 1 && req[b].parts == 1) {  // the request's only chunk: its sums over its totals
                float *o = out + (b * heads + first * group) * d;
                for (int64_t r = 0; r < task_rows; r++) {
                    const VecF divisor = vec_set1(total[r] > 0.0f ? total[r] : 1.0f);
                    for (int64_t i = 0; i < d; i += WIDTH)
                        vec_store(o + r * d + i, vec_div(vec_load(sums + r * d + i), divisor));
                }
            }
        }
        // The chunks of each request that has several, merged in order: sums and totals rescaled to the
        // largest score. A shared chunk's row for a member is its place among the group's rows.
#pragma omp for schedule(static)
        for (int64_t br = 0; br < batch * heads; br++) {
            const int64_t b = br / heads, r = br % heads, h = r / group, a = r % group;
            const int64_t chunks = req[b].parts;
            if (chunks < 2) continue;
            float top = -INFINITY, total = 0.0f;
            for (int64_t c = 0; c < chunks; c++) {
                const int64_t at = chunk_row(req, unit, chunk_unit, most, b, c, h, a, group);
                top = tops[at] > top ? tops[at] : top;
            }
            float *o = out + br * d;
            for (int64_t i = 0; i < d; i += WIDTH) vec_store(o + i, vec_zero());
            for (int64_t c = 0; c < chunks; c++) {
                const int64_t at = chunk_row(req, unit, chunk_unit, most, b, c, h, a, group);
                const float weight = expf(tops[at] - top);
                total += weight * totals[at];
                for (int64_t i = 0; i < d; i += WIDTH)
                    vec_store(o + i, vec_fmadd(vec_set1(weight), vec_load(partial + at * d + i), vec_load(o + i)));
            }
            const VecF divisor = vec_set1(total > 0.0f ? total : 1.0f);
            for (int64_t i = 0; i < d; i += WIDTH) vec_store(o + i, vec_div(vec_load(o + i), divisor));
        }
    }
    return failed ? KERNELS_NO_MEMORY : KERNELS_OK;
}

// An extend pass's rows split over the threads, each rounded and stored in one pass: through torch it took a
// strided cast into a temporary and a scatter of that.
int store_new_kv(const float *k, int64_t k_stride, const float *v, int64_t v_stride, const int64_t *out_slots,
                 int64_t tokens, void *k_pool, void *v_pool, int64_t slots, int kv_bf16, int64_t kv_heads, int64_t d,
                 int threads) {
    const int invalid = check_new_kv(out_slots, tokens, slots, kv_heads, d);
    if (invalid) return invalid;
    const int64_t row = kv_heads * d;
#pragma omp parallel for num_threads(threads) schedule(static) if (tokens > 16)
    for (int64_t t = 0; t < tokens; t++) {
        store_kv(k_pool, out_slots[t] * row, k + t * k_stride, row, kv_bf16);
        store_kv(v_pool, out_slots[t] * row, v + t * v_stride, row, kv_bf16);
    }
    return KERNELS_OK;
}

#else  // no SIMD: the reference is the body

int paged_decode_attention(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                           int64_t v_stride, const int64_t *out_slots, void *k_pool, void *v_pool, int64_t slots,
                           int kv_bf16, const int64_t *kv_slots, int64_t stride, const int64_t *kv_lens, int64_t batch,
                           int64_t heads, int64_t kv_heads, int64_t d, float scale, float *out, int threads) {
    (void)threads;
    return paged_decode_attention_ref(q, q_stride, k, k_stride, v, v_stride, out_slots, k_pool, v_pool, slots, kv_bf16,
                                      kv_slots, stride, kv_lens, batch, heads, kv_heads, d, scale, out);
}

int store_new_kv(const float *k, int64_t k_stride, const float *v, int64_t v_stride, const int64_t *out_slots,
                 int64_t tokens, void *k_pool, void *v_pool, int64_t slots, int kv_bf16, int64_t kv_heads, int64_t d,
                 int threads) {
    (void)threads;
    return store_new_kv_ref(k, k_stride, v, v_stride, out_slots, tokens, k_pool, v_pool, slots, kv_bf16, kv_heads, d);
}

#endif
