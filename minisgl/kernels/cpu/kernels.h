// The kernels' boundary: every struct and entry point the Python side calls, declared once.
// native.py reads this file (cffi parses it: plain declarations only, no macros or inline code)
// and binds the library through it. The helpers the sources share internally are in simd.h.
//
// Each entry point with a SIMD body has a plain C reference (`*_ref`), compiled into every library and
// exported, that the tests check the library's SIMD body against. Functions that return int return 0 on success,
// else one of these codes.
#pragma once
#include <stdint.h>

enum {
    KERNELS_OK = 0,
    KERNELS_BAD_SHAPE = 1,
    KERNELS_NO_MEMORY = 2,
    KERNELS_BAD_OUT_SLOT = 3,  // an out_slots entry outside the pool
    KERNELS_BAD_KV_LEN = 4,    // a kv_lens entry outside [0, kv_slots' row length]
    KERNELS_BAD_KV_SLOT = 5,   // an attended kv_slots entry outside the pool
    KERNELS_NO_INSTRUCTIONS = 6,  // this CPU lacks the instructions the entry point's body needs
};

// One int4 weight [N, K], in tiles of 16 output rows (the last one padded with zero rows): codes
// [tiles, K / 32, 4, 16, 4] uint8 (per tile and group of 32 columns, 4 vectors of each row's 4 bytes;
// byte b of vector i holds column 4i + b in its low nibble and 16 + 4i + b in its high one), fp16 scale
// and minimum [tiles, K / 32, 16]; w = code * scale + minimum (quant_gemm.c).
typedef struct {
    const uint8_t *codes;
    const uint16_t *scale, *minimum;
} Int4;

// One int8 weight [N, K], in tiles of 16 output rows (the last one padded with zero rows): codes
// [tiles, K / 32, 8, 16, 4] int8 (per tile and group of 32 columns, 8 vectors of each row's 4 bytes;
// byte b of vector i holds column 4i + b), fp32 scale [tiles * 16] (one per row); w = code * scale
// (quant_gemm.c).
typedef struct {
    const int8_t *codes;
    const float *scale;
} Int8;

// A projection of decode_layer.c or mlp_bf16: the weight that `bits` (4 or 8) names is set.
typedef struct {
    int bits;
    Int4 int4;
    Int8 int8;
} Projection;

// What one layer is for decode_layer.c: its shapes and weights (built once).
typedef struct {
    int64_t layer, hidden, heads, kv_heads, head_dim, intermediate;
    float eps;
    const float *input_norm, *post_norm;  // [hidden]
    Projection qkv, o, gate_up, down;
    const float *qkv_bias;         // [(heads + 2 kv_heads) * head_dim] added to the QKV product (Qwen2), or NULL
    const float *q_norm, *k_norm;  // [head_dim]: each head of Q and K RMS-normalised before RoPE (Qwen3), or NULL
} Layer;

// What one decode step is, the same for every layer.
typedef struct {
    int64_t batch;
    void *k_pool, *v_pool;      // all layers' [layers, slots, kv_heads, head_dim]
    int kv_bf16;                // the pools' dtype: bf16, else fp32
    int64_t pool_slots;         // slots per layer of the pools
    int64_t pool_layer_stride;  // elements per layer of the pools
    const int64_t *out_slots, *kv_slots, *kv_lens;
    int64_t kv_stride;          // entries per row of kv_slots
    const float *cos, *sin;     // [batch, head_dim], sin's first half negated
    float *scratch;             // decode_layer_scratch() floats
    int threads;
} Step;

// The instruction set this library's SIMD bodies were compiled for: "amx", "avx512", "avxvnni", "avx2",
// or "scalar" (the references only).
const char *kernels_variant(void);

// Asks the OS for what this library's instructions need before their first use (bf16_gemm.c): with AMX,
// Linux's permission for the tile state (arch_prctl(ARCH_REQ_XCOMP_PERM)), without which the first tile
// instruction dies with SIGILL. KERNELS_NO_INSTRUCTIONS where it is refused; KERNELS_OK elsewhere.
int kernels_prepare(void);

// The quantized products at every row count (quant_gemm.c): x [rows, K] fp32 rounded to `digits` int8
// digits (1 or 2) per group of 32 columns, y [rows, N] fp32.
int int4_gemm(const float *x, int digits, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
              const uint16_t *minimum, int64_t N, float *y, int threads);
int int4_gemm_ref(const float *x, int digits, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                  const uint16_t *minimum, int64_t N, float *y);
int int8_gemm(const float *x, int digits, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
              float *y, int threads);
int int8_gemm_ref(const float *x, int digits, int64_t rows, int64_t K, const int8_t *codes, const float *scale,
                  int64_t N, float *y);
// The same products (one digit) of rows the layer that computed them rounded (rms_norm_rounded,
// silu_mul_rounded): x_codes [rows, K] int8, its buffer readable up to a multiple of 16 rows (the amx build's
// tile loads); per row and group of 32 columns x_step, x_total (its digits' sum) and x_sum (x_total * x_step).
int int4_gemm_rounded(const int8_t *x_codes, const float *x_step, const int32_t *x_total, const float *x_sum,
                      int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum,
                      int64_t N, float *y, int threads);
int int8_gemm_rounded(const int8_t *x_codes, const float *x_step, const int32_t *x_total, const float *x_sum,
                      int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N, float *y,
                      int threads);

// The same products with x rounded to bf16 and the weight dequantized to bf16, summed in fp32 on the
// tile unit (bf16_gemm.c): the prefill rows with the amx build; KERNELS_NO_INSTRUCTIONS in the others.
int int4_gemm_bf16(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                   const uint16_t *minimum, int64_t N, float *y, int threads);
int int4_gemm_bf16_ref(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                       const uint16_t *minimum, int64_t N, float *y);
int int8_gemm_bf16(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                   float *y, int threads);
int int8_gemm_bf16_ref(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                       float *y);
// An MLP's prefill rows the same way (bf16_gemm.c): y [rows, H] = down(silu(gate) * up), [gate | up] = x gate_up^T
// [rows, 2 I] summed on the tile unit and its activation (silu_mul's arithmetic) rounded to bf16 for the down
// projection's tiles, never written out. Each row the same bits as the two products with the activation
// written out between them. KERNELS_NO_INSTRUCTIONS but in the amx build.
int mlp_bf16(const float *x, int64_t rows, int64_t H, const Projection *gate_up, int64_t I, const Projection *down,
             float *y, int threads);
int mlp_bf16_ref(const float *x, int64_t rows, int64_t H, const Projection *gate_up, int64_t I, const Projection *down,
                 float *y);

// Request b's query heads, new key and new value each lie contiguous, q_stride, k_stride and v_stride floats after
// request b - 1's (views into the fused QKV output, as store_new_kv takes its rows).
// The slots and lengths are checked against `slots` (the pool's) and `stride` before anything is written. With a
// bf16 pool (kv_bf16) the products are bf16 by bf16 where decode_attention_bf16() (the queries and softmax weights
// rounded to bf16, sums in fp32; the reference likewise), else fp32.
int decode_attention_bf16(void);
int paged_decode_attention(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                           int64_t v_stride, const int64_t *out_slots, void *k_pool, void *v_pool, int64_t slots,
                           int kv_bf16, const int64_t *kv_slots, int64_t stride, const int64_t *kv_lens, int64_t batch,
                           int64_t heads, int64_t kv_heads, int64_t d, float scale, float *out, int threads);
int paged_decode_attention_ref(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                               int64_t v_stride, const int64_t *out_slots, void *k_pool, void *v_pool, int64_t slots,
                               int kv_bf16, const int64_t *kv_slots, int64_t stride, const int64_t *kv_lens,
                               int64_t batch, int64_t heads, int64_t kv_heads, int64_t d, float scale, float *out);

// An extend pass's new keys and values stored at their slots (paged_attention.c): token t's k (its heads
// contiguous, k_stride floats after token t - 1's: a view into the fused QKV output) and v at out_slots[t] of
// k_pool and v_pool ([slots, kv_heads, d], bf16 if kv_bf16 else fp32), rounded to bf16 as torch's cast rounds;
// the slots checked before anything is written. d a multiple of 16.
int store_new_kv(const float *k, int64_t k_stride, const float *v, int64_t v_stride, const int64_t *out_slots,
                 int64_t tokens, void *k_pool, void *v_pool, int64_t slots, int kv_bf16, int64_t kv_heads, int64_t d,
                 int threads);
int store_new_kv_ref(const float *k, int64_t k_stride, const float *v, int64_t v_stride, const int64_t *out_slots,
                     int64_t tokens, void *k_pool, void *v_pool, int64_t slots, int kv_bf16, int64_t kv_heads,
                     int64_t d);

// Causal attention of an extend pass's queries over a bf16 pool (prefill_attention.c), their keys and
// values already stored: request b's queries are rows q_starts[b] .. + new_lens[b] of q [tokens, heads, d]
// fp32 (each token's heads contiguous, its row q_stride floats after the one before: a view into the fused
// QKV output), its keys and values the first prefix_lens[b] + new_lens[b] slots of kv_slots' row b ([batch,
// stride]), and its token t sees the first prefix_lens[b] + t + 1 of them; out [tokens, heads, d] fp32 (rows
// of no request untouched). The body runs where prefill_attention_runs() (AVX2; AVX-512 BF16 for the AVX-512 builds, the amx build's
// products on AMX-BF16 where d is a multiple of 32), else returns KERNELS_NO_INSTRUCTIONS.
int prefill_attention_runs(void);
int prefill_attention(const float *q, int64_t q_stride, int64_t tokens, int64_t heads, int64_t kv_heads,
                      int64_t d, const uint16_t *k_pool, const uint16_t *v_pool, int64_t slots,
                      const int64_t *kv_slots, int64_t stride, const int64_t *q_starts, const int64_t *new_lens,
                      const int64_t *prefix_lens, int64_t batch, float scale, float *out, int threads);
int prefill_attention_ref(const float *q, int64_t q_stride, int64_t tokens, int64_t heads, int64_t kv_heads,
                          int64_t d, const uint16_t *k_pool, const uint16_t *v_pool, int64_t slots,
                          const int64_t *kv_slots, int64_t stride, const int64_t *q_starts, const int64_t *new_lens,
                          const int64_t *prefix_lens, int64_t batch, float scale, float *out);

void rms_norm(const float *x, const float *delta, float *sum_out, const float *weight, int64_t rows, int64_t n,
              float eps, float *out, int threads);
void rotary(const float *x, int64_t stride, int64_t tokens, int64_t heads, int64_t d, const float *cos,
            const float *sin, float *out, int threads);
void silu_mul(const float *gate_up, int64_t rows, int64_t n, float *act, int threads);
// rms_norm and silu_mul with their output rounded for the products instead of written in fp32 (n a multiple
// of 32): codes, step, total and sum as int4_gemm_rounded takes them, the bits the products would round.
int rms_norm_rounded(const float *x, const float *delta, float *sum_out, const float *weight, int64_t rows,
                     int64_t n, float eps, int8_t *codes, float *step, int32_t *total, float *sum, int threads);
int silu_mul_rounded(const float *gate_up, int64_t rows, int64_t n, int8_t *codes, float *step, int32_t *total,
                     float *sum, int threads);

// out[r] = the index of the largest of row r of x [rows, n] fp32, the first of equal ones, or of the row's first
// NaN (torch.max's indices; logits.c).
int argmax_rows(const float *x, int64_t rows, int64_t n, int64_t *out, int threads);
int argmax_rows_ref(const float *x, int64_t rows, int64_t n, int64_t *out);

// out[r] = log sum_i e^x[r, i] of x [rows, n] fp32: NaN for a row with a NaN, the largest value where it is
// infinite (logits.c).
int logsumexp_rows(const float *x, int64_t rows, int64_t n, float *out, int threads);
int logsumexp_rows_ref(const float *x, int64_t rows, int64_t n, float *out);

int64_t decode_layer_scratch(int64_t batch, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                             int64_t intermediate);
int decode_layers(const Layer *layers, int64_t count, const Step *s, const float *x, float *residual, float *out,
                  float *buffer);

// A GGUF file's blocks written into rows [first, first + rows) of an [N, K] weight's tiles (gguf_tiles.c,
// the loader's): Q4_0 (q4_1 = 0: 18-byte blocks, fp16 d and 16 code bytes; minimum -8 d) or Q4_1
// (20 bytes: fp16 d, fp16 m, 16 code bytes) as they are, Q8_0 (34 bytes: fp16 d, 32 int8 codes)
// rounded to one scale per row as Int8Weight.quantize rounds the dequantized row.
int int4_tiles_from_gguf(const uint8_t *blocks, int q4_1, int64_t rows, int64_t K, int64_t first, uint8_t *codes,
                         uint16_t *scale, uint16_t *minimum, int64_t N, int threads);
int int8_tiles_from_q8_0(const uint8_t *blocks, int64_t rows, int64_t K, int64_t first, int8_t *codes, float *scale,
                         int64_t N, int threads);
