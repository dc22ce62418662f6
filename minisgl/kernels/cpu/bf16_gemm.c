// The prefill rows' quantized products on AMX-BF16 (the amx build: Sapphire Rapids and later), as vLLM's and
// llama.cpp's CPU prefill run on the tile unit: y [rows, N] = x [rows, K] W^T with x rounded to bf16 and the
// weight dequantized to bf16 (int4: code * scale + minimum in one fma, int8: code * scale, then rounded),
// the products summed in fp32 over all K. quant_gemm.c's integer kernels apply each group's scales to each
// group's sums in fp32: next to 16 x 16 x 32 tile products that float work would be most of a product's
// time, where here the sums stay in the tile registers. The engine runs the prefill rows here and every
// decode row in quant_gemm.c, so each row's arithmetic is fixed by what it is, never by what shares its
// pass; a row's sums are in the same order whatever the other rows (each output is its own chain of tile
// products). mlp_bf16 runs an MLP's two products: gate_up's sums leave the tiles as SwiGLU's activation,
// rounded to bf16 and laid out for the down projection's tiles (activation.c's arithmetic: simd.h's
// vec_silu_mul), so that a prefill pass never writes gate_up (2 x intermediate fp32 a row) out and reads it back
// (on the 2-core Sapphire Rapids VM: 1.20x at 135M and 1.21x at 1.7B on a band of rows,
// docs/benchmarks/session39-spr/prefill_mlp_ab.txt).
//
// Blocking: the rows of x in chunks (CHUNK_ROWS), each against the whole weight; per chunk, K in spans
// whose x (the chunk's rows, bf16) stays in L2; per span, each thread takes its pairs of the weight's tiles
// (32 output rows) and a pair's span in steps of up to STEP_GROUPS groups: it dequantizes a step into the
// tile layout (per group of 32 columns, 16 rows of 16 outputs x 2 columns: the bf16 pairs the tile
// instruction takes), where it stays in L1 while every two blocks of 16 rows of x run against it: 4 sum
// registers (2 x 2 blocks of 16 x 16), 2 of x, 2 of the weight. x's tiles are loaded with the streaming
// hint (tileloaddt1): each is read once per pair, and plain loads would take L1 from the pair, which then
// could hold only short steps, each step a load and a store of every block's sums (135M's 576-column weights
// in one step instead of three; on the 2-core Sapphire Rapids VM 1.12-1.24x, and 1.03-1.07x at 1.7B:
// docs/benchmarks/session39-spr/prefill_products_ab.txt). The sums wait in a buffer of the thread's between steps and in y between spans
// (fp32: exact).

#define _GNU_SOURCE  // syscall(): Linux's permission for the tile state (kernels_prepare)
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

#if defined(KERNELS_AMX)
#include <sys/syscall.h>
#include <unistd.h>
#endif

int kernels_prepare(void) {
#if defined(KERNELS_AMX)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };  // Linux's asm/prctl.h (5.16 and later)
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? KERNELS_OK
                                                                                : KERNELS_NO_INSTRUCTIONS;
#else
    return KERNELS_OK;
#endif
}

#define SPAN_X_BYTES (1 << 20)  // x's bytes per span: in L2 beside a thread's dequantized pair
// Rows of x per pass over the weight, at least: more would make each span's sums (rows x N fp32) go to
// memory and back. Where one span holds all of K (a small K) a chunk takes as many rows as fit it, since
// each chunk dequantizes the weight anew (docs/benchmarks/session29-spr/tile_ab.py).
#define CHUNK_ROWS 256
// Groups of a pair dequantized at a time (36 KB at most: L1 holds it while x's tiles stream past); a span is
// cut into equal steps (docs/benchmarks/session39-spr/prefill_products_ab.py).
#define STEP_GROUPS 18

static float int4_weight_at(const uint8_t *codes, const uint16_t *scale, const uint16_t *minimum, int64_t K,
                            int64_t o, int64_t k) {
    const int64_t at = (o / TILE * (K / GROUP) + k / GROUP) * TILE + o % TILE;
    return fmaf((float)int4_code_at(codes, K, o, k), float_of_fp16(scale[at]), float_of_fp16(minimum[at]));
}

static float int8_weight_at(const int8_t *codes, const float *scale, int64_t K, int64_t o, int64_t k) {
    return (float)int8_code_at(codes, K, o, k) * scale[o];
}

// The references: the same roundings, the sums in column order.
static int gemm_bf16_ref(const float *x, int64_t rows, int64_t K, const void *codes, const void *scale,
                         const uint16_t *minimum, int64_t N, float *y) {
    if (K % GROUP) return KERNELS_BAD_SHAPE;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < N; o++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                const float w = minimum != NULL ? int4_weight_at(codes, scale, minimum, K, o, k)
                                                : int8_weight_at(codes, scale, K, o, k);
                acc = fmaf(float_of_bf16(bf16_of(x[r * K + k])), float_of_bf16(bf16_of(w)), acc);
            }
            y[r * N + o] = acc;
        }
    return KERNELS_OK;
}

int int4_gemm_bf16_ref(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                       const uint16_t *minimum, int64_t N, float *y) {
    return gemm_bf16_ref(x, rows, K, codes, scale, minimum, N, y);
}

int int8_gemm_bf16_ref(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                       float *y) {
    return gemm_bf16_ref(x, rows, K, codes, scale, NULL, N, y);
}

// A projection's buffers (kernels.h's Projection) as the functions here take them: a minimum for int4 only.
static const void *codes_of(const Projection *w) {
    return w->bits == 4 ? (const void *)w->int4.codes : (const void *)w->int8.codes;
}
static const void *scale_of(const Projection *w) {
    return w->bits == 4 ? (const void *)w->int4.scale : (const void *)w->int8.scale;
}
static const uint16_t *minimum_of(const Projection *w) { return w->bits == 4 ? w->int4.minimum : NULL; }

// The reference: gate_up's products written out, SwiGLU's activation (silu in libm's expf, where the SIMD
// body takes simd.h's: the same within fp32 rounding), then the down projection's products.
int mlp_bf16_ref(const float *x, int64_t rows, int64_t H, const Projection *gate_up, int64_t I, const Projection *down,
                 float *y) {
    if (H % GROUP || I % GROUP) return KERNELS_BAD_SHAPE;
    float *sums = malloc(sizeof(float) * (size_t)(rows * 3 * I));
    if (sums == NULL) return KERNELS_NO_MEMORY;
    float *act = sums + rows * 2 * I;
    gemm_bf16_ref(x, rows, H, codes_of(gate_up), scale_of(gate_up), minimum_of(gate_up), 2 * I, sums);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < I; i++) {
            const float gate = sums[r * 2 * I + i], up = sums[r * 2 * I + I + i];
            act[r * I + i] = gate / (1.0f + expf(-gate)) * up;
        }
    gemm_bf16_ref(act, rows, I, codes_of(down), scale_of(down), minimum_of(down), H, y);
    free(sums);
    return KERNELS_OK;
}

#if defined(KERNELS_AMX)

#define BLOCK 16                             // rows of a tile register: of x, of sums
#define PAIR_BYTES (GROUP * TILE * 2)        // one group of one tile, dequantized: 16 rows of 64 bytes

// Which byte of a 4-column piece (16 outputs x 4 bytes) each fp32 lane of a tile row's half takes, in every
// byte of the lane's dword: tile row `pair` (columns 2 pair, 2 pair + 1 of the piece), outputs 8 half ..
// 8 half + 7, lane 2i + c holding output 8 half + i, column 2 pair + c.
static inline __m512i piece_index(int pair, int half) {
    const __m512i lanes = _mm512_set_epi32(29, 28, 25, 24, 21, 20, 17, 16, 13, 12, 9, 8, 5, 4, 1, 0);
    return _mm512_mullo_epi32(_mm512_add_epi32(lanes, _mm512_set1_epi32(32 * half + 2 * pair)),
                              _mm512_set1_epi32(0x01010101));
}

// Codes [16 outputs x 4] as bytes (of 4 consecutive columns c0 .. c0 + 3, unsigned or signed), with the
// outputs' scales and minimums (zeros for int8) as fp32 (lane 2i + c: output i of the half), into the two
// tile rows of column pairs c0 / 2 and c0 / 2 + 1: each code moved into its own dword (vpermb: an unsigned
// one into the low byte, a signed one into the high byte and shifted down), times the scale plus the
// minimum in one fma, rounded to bf16.
static inline void dequantize_quads(__m512i quads, int is_signed, const __m512i index[2][2], const __m512 scale[2],
                                    const __m512 minimum[2], uint8_t *out) {
    for (int pair = 0; pair < 2; pair++) {
        __m512 w[2];
        for (int half = 0; half < 2; half++) {
            const __mmask64 bytes = is_signed ? 0x8888888888888888ull : 0x1111111111111111ull;
            const __m512i moved = _mm512_maskz_permutexvar_epi8(bytes, index[pair][half], quads);
            const __m512i codes = is_signed ? _mm512_srai_epi32(moved, 24) : moved;
            w[half] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(codes), scale[half], minimum[half]);
        }
        _mm512_store_si512(out + pair * 64, (__m512i)_mm512_cvtne2ps_pbh(w[1], w[0]));
    }
}

// Tile t's groups g0 .. g1 dequantized into out: per group 16 tile rows (column pairs) of 16 outputs.
// A tile past the weight's last (an odd count's pair) is zeros.
static void dequantize_tile(int bits, const void *codes, const void *scale, const uint16_t *minimum, int64_t K,
                            int64_t tiles, int64_t t, int64_t g0, int64_t g1, uint8_t *out) {
    if (t >= tiles) {
        memset(out, 0, (size_t)((g1 - g0) * PAIR_BYTES));
        return;
    }
    const int64_t groups = K / GROUP;
    // Lane 2i and 2i + 1 of the fp32 vectors: output i (of 0-7, or of 8-15).
    const __m512i repeat_lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i repeat_hi = _mm512_add_epi32(repeat_lo, _mm512_set1_epi32(8));
    const __m512i index[2][2] = {{piece_index(0, 0), piece_index(0, 1)}, {piece_index(1, 0), piece_index(1, 1)}};
    __m512 row_scale = _mm512_setzero_ps();
    if (bits == 8) row_scale = _mm512_loadu_ps((const float *)scale + t * TILE);
    for (int64_t g = g0; g < g1; g++, out += PAIR_BYTES) {
        const int64_t at = (t * groups + g) * TILE;
        __m512 s, m = _mm512_setzero_ps();
        if (bits == 4) {
            s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)scale + at)));
            m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(minimum + at)));
        } else {
            s = row_scale;
        }
        const __m512 halves_s[2] = {_mm512_permutexvar_ps(repeat_lo, s), _mm512_permutexvar_ps(repeat_hi, s)};
        const __m512 halves_m[2] = {_mm512_permutexvar_ps(repeat_lo, m), _mm512_permutexvar_ps(repeat_hi, m)};
        if (bits == 4) {  // vector i: columns 4i .. 4i + 3 in the low nibbles, 16 + 4i .. in the high ones
            const uint8_t *group = (const uint8_t *)codes + (t * groups + g) * 4 * 4 * TILE;
            const __m512i nibble = _mm512_set1_epi8(0x0F);
            for (int i = 0; i < 4; i++) {
                const __m512i v = _mm512_loadu_si512(group + i * 4 * TILE);
                dequantize_quads(_mm512_and_si512(v, nibble), 0, index, halves_s, halves_m, out + i * 128);
                dequantize_quads(_mm512_and_si512(_mm512_srli_epi16(v, 4), nibble), 0, index, halves_s, halves_m,
                                 out + (4 + i) * 128);
            }
        } else {  // vector i: columns 4i .. 4i + 3
            const int8_t *group = (const int8_t *)codes + (t * groups + g) * 8 * 4 * TILE;
            for (int i = 0; i < 8; i++)
                dequantize_quads(_mm512_loadu_si512(group + i * 4 * TILE), 1, index, halves_s, halves_m,
                                 out + i * 128);
        }
    }
}

// The 32 x 32 block of sums at rows r0 .., outputs o0 .. (two tiles) moves between the tile registers 0-3
// and y: in place where it lies inside y, else through `edge` (the part inside y copied in and out).
static int block_inside(int64_t rows, int64_t N, int64_t r0, int64_t o0) {
    return r0 + 2 * BLOCK <= rows && o0 + 2 * TILE <= N;
}

static void copy_block(float *to, int64_t to_stride, const float *from, int64_t from_stride, int64_t rows,
                       int64_t columns) {
    for (int64_t r = 0; r < rows; r++)
        memcpy(to + r * to_stride, from + r * from_stride, sizeof(float) * (size_t)columns);
}

// op (_tile_loadd or _tile_stored) on the sum registers 0-3 and the block at `at`, `stride` floats a row.
#define BLOCK_TILES(op, at, stride)                                               \
    do {                                                                          \
        const size_t bytes = sizeof(float) * (size_t)(stride);                    \
        op(0, (at), bytes);                                                       \
        op(1, (at) + TILE, bytes);                                                \
        op(2, (at) + BLOCK * (stride), bytes);                                    \
        op(3, (at) + BLOCK * (stride) + TILE, bytes);                             \
    } while (0)

static void block_load(const float *y, int64_t rows, int64_t N, int64_t r0, int64_t o0, float *edge) {
    if (block_inside(rows, N, r0, o0)) {
        BLOCK_TILES(_tile_loadd, y + r0 * N + o0, N);
        return;
    }
    memset(edge, 0, sizeof(float) * 4 * BLOCK * TILE);
    copy_block(edge, 2 * TILE, y + r0 * N + o0, N, min64(2 * BLOCK, rows - r0), min64(2 * TILE, N - o0));
    BLOCK_TILES(_tile_loadd, edge, 2 * TILE);
}

static void block_store(float *y, int64_t rows, int64_t N, int64_t r0, int64_t o0, float *edge) {
    if (block_inside(rows, N, r0, o0)) {
        BLOCK_TILES(_tile_stored, y + r0 * N + o0, N);
        return;
    }
    BLOCK_TILES(_tile_stored, edge, 2 * TILE);
    copy_block(y + r0 * N + o0, N, edge, 2 * TILE, min64(2 * BLOCK, rows - r0), min64(2 * TILE, N - o0));
}

// x [rows, K] in bf16 as the tile registers take it, into xb: per block of 16 rows and group, 16 rows of 32
// columns (1 KB, one load); the rows past `rows` (up to `padded`) zeros.
static void lay_out(const float *x, int64_t rows, int64_t padded, int64_t K, uint16_t *xb, int threads) {
    const int64_t groups = K / GROUP;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < padded; r++)
        for (int64_t g = 0; g < groups; g++) {
            uint16_t *out = xb + ((r / BLOCK * groups + g) * BLOCK + r % BLOCK) * GROUP;
            for (int half = 0; half < 2; half++) {
                const __m512 v = r < rows ? _mm512_loadu_ps(x + r * K + g * GROUP + half * 16) : _mm512_setzero_ps();
                _mm256_store_si256((__m256i *)(out + half * 16), (__m256i)_mm512_cvtneps_pbh(v));
            }
        }
}

// An MLP's gate_up block of sums (tile registers 0-3: rows r0 .., 16 gates at tile 0 and 2, their ups at 1
// and 3) leaves the tiles as SwiGLU's activation silu(gate) * up (activation.c's arithmetic: simd.h's
// vec_silu_mul), rounded to bf16 into `act`, laid out as lay_out lays out x for the down projection (I columns).
static void store_activation(uint16_t *act, int64_t I, int64_t r0, int64_t t, float *edge) {
    BLOCK_TILES(_tile_stored, edge, 2 * TILE);
    const int64_t groups = I / GROUP, column = t * TILE;
    for (int64_t r = 0; r < 2 * BLOCK; r++) {
        const __m512 v = vec_silu_mul(_mm512_load_ps(edge + r * 2 * TILE), _mm512_load_ps(edge + r * 2 * TILE + TILE));
        uint16_t *out = act + (((r0 + r) / BLOCK * groups + column / GROUP) * BLOCK + (r0 + r) % BLOCK) * GROUP;
        _mm256_store_si256((__m256i *)(out + column % GROUP), (__m256i)_mm512_cvtneps_pbh(v));
    }
}

// The products of xb (lay_out's, `padded` rows) with a weight [N, K], y [rows, N] (fp32), its tiles in pairs
// (2p, 2p + 1). With `act`, the weight is an MLP's gate_up ([gate | up], N = 2 I): the pairs are a tile of
// gates and the tile of their ups (t, t + I / 16), and the sums leave the tiles as store_activation's
// activation instead of into y (all of K in one span, which mlp_bf16's chunks of rows are cut to fit). Each
// output's sums are the same chain of tile products either way.
static int products(int bits, const uint16_t *xb, int64_t rows, int64_t padded, int64_t K, const void *codes,
                    const void *scale, const uint16_t *minimum, int64_t N, float *y, uint16_t *act, int threads) {
    const int64_t groups = K / GROUP, tiles = (N + TILE - 1) / TILE, pairs = act ? tiles / 2 : (tiles + 1) / 2;
    const int64_t span_groups =
        act ? groups : max64(1, min64(groups, SPAN_X_BYTES / (padded * GROUP * (int64_t)sizeof(uint16_t))));
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        static _Thread_local Scratch pair_scratch, sums_scratch;
        uint8_t *pair = team_reserve(&pair_scratch, (size_t)(2 * STEP_GROUPS * PAIR_BYTES), &failed);
        float *sums = team_reserve(&sums_scratch, sizeof(float) * (size_t)(padded * 2 * TILE), &failed);
        float edge[4 * BLOCK * TILE] __attribute__((aligned(64)));
        const int thread = omp_get_thread_num(), count = omp_get_num_threads();
        const int64_t p0 = pairs * thread / count, p1 = pairs * (thread + 1) / count;
        if (pair != NULL && sums != NULL) {
            tiles_configure();
            for (int64_t g0 = 0; g0 < groups; g0 += span_groups) {
                const int64_t g1 = min64(g0 + span_groups, groups), steps = (g1 - g0 + STEP_GROUPS - 1) / STEP_GROUPS;
                const int64_t step = (g1 - g0 + steps - 1) / steps;  // the span in equal steps
                for (int64_t p = p0; p < p1; p++) {
                    const int64_t first = act ? p : 2 * p, second_tile = act ? p + tiles / 2 : 2 * p + 1;
                    for (int64_t s0 = g0; s0 < g1; s0 += step) {
                        const int64_t s1 = min64(s0 + step, g1), o0 = 2 * p * TILE;
                        uint8_t *second = pair + (s1 - s0) * PAIR_BYTES;
                        dequantize_tile(bits, codes, scale, minimum, K, tiles, first, s0, s1, pair);
                        dequantize_tile(bits, codes, scale, minimum, K, tiles, second_tile, s0, s1, second);
                        for (int64_t r0 = 0; r0 < padded; r0 += 2 * BLOCK) {
                            float *held = sums + r0 * 2 * TILE;  // this block's sums between steps
                            if (s0 == 0) {
                                _tile_zero(0);
                                _tile_zero(1);
                                _tile_zero(2);
                                _tile_zero(3);
                            } else if (s0 == g0) {
                                block_load(y, rows, N, r0, o0, edge);
                            } else {
                                BLOCK_TILES(_tile_loadd, held, 2 * TILE);
                            }
                            const uint16_t *x0 = xb + r0 * K, *x1 = x0 + BLOCK * K;  // two blocks of rows
                            for (int64_t g = s0; g < s1; g++) {
                                _tile_stream_loadd(4, x0 + g * BLOCK * GROUP, 64);
                                _tile_stream_loadd(5, x1 + g * BLOCK * GROUP, 64);
                                _tile_loadd(6, pair + (g - s0) * PAIR_BYTES, 64);
                                _tile_loadd(7, second + (g - s0) * PAIR_BYTES, 64);
                                _tile_dpbf16ps(0, 4, 6);
                                _tile_dpbf16ps(1, 4, 7);
                                _tile_dpbf16ps(2, 5, 6);
                                _tile_dpbf16ps(3, 5, 7);
                            }
                            if (s1 < g1) {
                                BLOCK_TILES(_tile_stored, held, 2 * TILE);
                            } else if (act) {
                                store_activation(act, N / 2, r0, p, edge);
                            } else {
                                block_store(y, rows, N, r0, o0, edge);
                            }
                        }
                    }
                }
            }
            _tile_release();
        }
    }
    return failed ? KERNELS_NO_MEMORY : KERNELS_OK;
}

// Rows of x at a time: at least CHUNK_ROWS, or as many as one span of K holds.
static int64_t chunk_rows(int64_t K) {
    return max64(CHUNK_ROWS, SPAN_X_BYTES / (K * (int64_t)sizeof(uint16_t)) / (2 * BLOCK) * (2 * BLOCK));
}

static int64_t padded_rows(int64_t rows) { return (rows + 2 * BLOCK - 1) / (2 * BLOCK) * (2 * BLOCK); }

static int gemm_bf16(int bits, const float *x, int64_t rows, int64_t K, const void *codes, const void *scale,
                     const uint16_t *minimum, int64_t N, float *y, int threads) {
    if (K % GROUP) return KERNELS_BAD_SHAPE;
    static _Thread_local Scratch x_scratch;
    const int64_t chunk = chunk_rows(K);
    for (int64_t r = 0; r < rows; r += chunk) {
        const int64_t n = min64(chunk, rows - r), padded = padded_rows(n);
        uint16_t *xb = scratch_reserve(&x_scratch, sizeof(uint16_t) * (size_t)(padded * K));
        if (xb == NULL) return KERNELS_NO_MEMORY;
        lay_out(x + r * K, n, padded, K, xb, threads);
        const int failed = products(bits, xb, n, padded, K, codes, scale, minimum, N, y + r * N, NULL, threads);
        if (failed) return failed;
    }
    return KERNELS_OK;
}

int int4_gemm_bf16(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                   const uint16_t *minimum, int64_t N, float *y, int threads) {
    return gemm_bf16(4, x, rows, K, codes, scale, minimum, N, y, threads);
}

int int8_gemm_bf16(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                   float *y, int threads) {
    return gemm_bf16(8, x, rows, K, codes, scale, NULL, N, y, threads);
}

int mlp_bf16(const float *x, int64_t rows, int64_t H, const Projection *gate_up, int64_t I, const Projection *down,
             float *y, int threads) {
    if (H % GROUP || I % GROUP) return KERNELS_BAD_SHAPE;
    static _Thread_local Scratch x_scratch, act_scratch;
    const int64_t chunk = chunk_rows(H);  // gate_up's K in one span, as products takes it with `act`
    for (int64_t r = 0; r < rows; r += chunk) {
        const int64_t n = min64(chunk, rows - r), padded = padded_rows(n);
        uint16_t *xb = scratch_reserve(&x_scratch, sizeof(uint16_t) * (size_t)(padded * H));
        uint16_t *act = scratch_reserve(&act_scratch, sizeof(uint16_t) * (size_t)(padded * I));
        if (xb == NULL || act == NULL) return KERNELS_NO_MEMORY;
        lay_out(x + r * H, n, padded, H, xb, threads);
        int failed = products(gate_up->bits, xb, n, padded, H, codes_of(gate_up), scale_of(gate_up),
                              minimum_of(gate_up), 2 * I, NULL, act, threads);
        if (!failed)
            failed = products(down->bits, act, n, padded, I, codes_of(down), scale_of(down), minimum_of(down), H,
                              y + r * H, NULL, threads);
        if (failed) return failed;
    }
    return KERNELS_OK;
}

#else  // no tile unit: the engine never calls these here

int int4_gemm_bf16(const float *x, int64_t rows, int64_t K, const uint8_t *codes, const uint16_t *scale,
                   const uint16_t *minimum, int64_t N, float *y, int threads) {
    (void)x, (void)rows, (void)K, (void)codes, (void)scale, (void)minimum, (void)N, (void)y, (void)threads;
    return KERNELS_NO_INSTRUCTIONS;
}

int int8_gemm_bf16(const float *x, int64_t rows, int64_t K, const int8_t *codes, const float *scale, int64_t N,
                   float *y, int threads) {
    (void)x, (void)rows, (void)K, (void)codes, (void)scale, (void)N, (void)y, (void)threads;
    return KERNELS_NO_INSTRUCTIONS;
}

int mlp_bf16(const float *x, int64_t rows, int64_t H, const Projection *gate_up, int64_t I, const Projection *down,
             float *y, int threads) {
    (void)x, (void)rows, (void)H, (void)gate_up, (void)I, (void)down, (void)y, (void)threads;
    return KERNELS_NO_INSTRUCTIONS;
}

#endif
