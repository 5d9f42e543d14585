// Row-int8 spine matrices (q · f16 row scale): a dequantiser into a template-layer f32 tensor,
// and a GEMV in the dense kernel's order (src/spine/dense.rs): 16 lanes of acc += q·x (a
// multiply then an add), the tail into the first lanes, a pairwise tree, then × scale.
#include "compat.h"

kernel void int8_dequant(device const char* q [[buffer(0)]],
                         device const ushort* scales [[buffer(1)]],
                         device float* out [[buffer(2)]],
                         constant uint& rows [[buffer(3)]],
                         constant uint& cols [[buffer(4)]],
                         uint i [[thread_position_in_grid]]) {
    if (i >= rows * cols) return;
    out[i] = float(q[i]) * f16_bits_to_float(scales[i / cols]);
}

inline float int8_row_dot(device const char* q, float scale, device const float* x, uint cols) {
    float acc[16];
    for (uint j = 0; j < 16; j++) acc[j] = 0.0f;
    uint full = cols - cols % 16;
    for (uint c = 0; c < full; c += 16) {
        for (uint j = 0; j < 16; j++) {
            float p = float(q[c + j]) * x[c + j];
            acc[j] = acc[j] + p;
        }
    }
    for (uint j = 0; j < cols - full; j++) {
        float p = float(q[full + j]) * x[full + j];
        acc[j] = acc[j] + p;
    }
    for (uint w = 8; w > 0; w /= 2) {
        for (uint i = 0; i < w; i++) acc[i] = acc[i] + acc[i + w];
    }
    return acc[0] * scale;
}

kernel void int8_gemv(device const char* q [[buffer(0)]],
                      device const ushort* scales [[buffer(1)]],
                      device const float* x [[buffer(2)]],
                      device float* y [[buffer(3)]],
                      constant uint& rows [[buffer(4)]],
                      constant uint& cols [[buffer(5)]],
                      uint row [[thread_position_in_grid]]) {
    if (row >= rows) return;
    y[row] = int8_row_dot(q + row * cols, f16_bits_to_float(scales[row]), x, cols);
}
