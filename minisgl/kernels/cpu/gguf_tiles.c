// A GGUF file's blocks written straight into the quantized weights' tiles (kernels.h's Int4 and Int8),
// for the loader: one pass over the memory-mapped file, no intermediate arrays. Plain loops: the work is
// moving bytes, bound by memory. Their reference is the loader's numpy and torch path
// (minisgl/models/gguf_tensors.py), which gives the same bytes, and which runs where the C kernels
// do not.
//
// Each writes rows [first, first + rows) of the weight, so that several tensors' rows make one weight
// (a fused projection); a tile shared with rows written by another call keeps theirs.

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

// -8 d in fp16 bits (Q4_0's minimum) as numpy rounds the fp32 product: exact, a power of two; past
// fp16's range an infinity; a NaN quieted, its sign kept.
static uint16_t fp16_times_minus8(uint16_t d) {
    const uint16_t sign = (uint16_t)((d ^ 0x8000) & 0x8000), exponent = (d >> 10) & 0x1F, mantissa = d & 0x3FF;
    if (exponent == 0x1F) return mantissa ? (uint16_t)(d | 0x200) : (uint16_t)(sign | 0x7C00);
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, times 8
        const uint32_t v = (uint32_t)mantissa << 3;
        if (v < 0x400) return (uint16_t)(sign | v);  // still subnormal
        uint32_t top = 10;  // v = 2^top * (1 + f), top in 10..12
        while (v >> (top + 1)) top++;
        // The bits shifted out are among v's three low ones, which are zero: exact.
        return (uint16_t)(sign | ((top - 9) << 10) | ((v - (1u << top)) >> (top - 10)));
    }
    if (exponent + 3 >= 0x1F) return (uint16_t)(sign | 0x7C00);
    return (uint16_t)(sign | ((exponent + 3) << 10) | mantissa);
}

int int4_tiles_from_gguf(const uint8_t *blocks, int q4_1, int64_t rows, int64_t K, int64_t first, uint8_t *codes,
                         uint16_t *scale, uint16_t *minimum, int64_t N, int threads) {
    if (K % GROUP || first < 0 || rows < 0 || first + rows > N) return KERNELS_BAD_SHAPE;
    const int64_t groups = K / GROUP, block_bytes = q4_1 ? 20 : 18, code_offset = q4_1 ? 4 : 2;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = first + r, tile = row / TILE, lane = row % TILE;
        const uint8_t *block = blocks + r * groups * block_bytes;
        for (int64_t g = 0; g < groups; g++, block += block_bytes) {
            uint16_t d, m;
            memcpy(&d, block, 2);
            if (q4_1) {
                memcpy(&m, block + 2, 2);
            } else {
                m = fp16_times_minus8(d);
            }
            const int64_t at = (tile * groups + g) * TILE + lane;
            scale[at] = d;
            minimum[at] = m;
            uint8_t *group = codes + (tile * groups + g) * 4 * TILE * 4;
            for (int i = 0; i < 4; i++) memcpy(group + (i * TILE + lane) * 4, block + code_offset + 4 * i, 4);
        }
    }
    return KERNELS_OK;
}

int int8_tiles_from_q8_0(const uint8_t *blocks, int64_t rows, int64_t K, int64_t first, int8_t *codes, float *scale,
                         int64_t N, int threads) {
    if (K % GROUP || first < 0 || rows < 0 || first + rows > N) return KERNELS_BAD_SHAPE;
    const int64_t groups = K / GROUP, block_bytes = 2 + GROUP;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = first + r, tile = row / TILE, lane = row % TILE;
        const uint8_t *line = blocks + r * groups * block_bytes;
        // Torch's arithmetic (Int8Weight.quantize on the dequantized row): each weight q * d exact in
        // fp32, step = max |w| / 127, code = round(w / step) to nearest even. A block's largest |w| is
        // its largest |q| times |d|, exactly.
        float largest = 0.0f;
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *block = line + g * block_bytes;
            int top = 0;
            for (int j = 0; j < GROUP; j++) {
                const int q = abs((int)(int8_t)block[2 + j]);
                top = q > top ? q : top;
            }
            uint16_t d;
            memcpy(&d, block, 2);
            const float w = (float)top * fabsf(float_of_fp16(d));
            largest = w > largest ? w : largest;
        }
        const float step = (largest > 1.17549435e-38f ? largest : 1.17549435e-38f) / 127.0f;  // FLT_MIN: a zero row
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *block = line + g * block_bytes;
            uint16_t d;
            memcpy(&d, block, 2);
            const float dg = float_of_fp16(d);
            int8_t rounded[GROUP];
            for (int j = 0; j < GROUP; j++) {
                const int code = (int)rintf((float)(int8_t)block[2 + j] * dg / step);
                rounded[j] = (int8_t)(code > 127 ? 127 : code < -127 ? -127 : code);
            }
            int8_t *group = codes + (tile * groups + g) * 8 * TILE * 4;
            for (int i = 0; i < 8; i++) memcpy(group + (i * TILE + lane) * 4, rounded + 4 * i, 4);
        }
        scale[row] = step;
    }
    return KERNELS_OK;
}
