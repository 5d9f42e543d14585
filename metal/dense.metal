// Spine matrices (`y = W x` for `tokens` input rows, one thread per output element), in the dense
// kernel's order (src/spine/dense.rs): 16 lanes of acc += w·x (a multiply then an add), the
// tail into the first lanes, a pairwise tree; row-int8 multiplies by the f16 row scale last.
// Also the row-int8 dequantiser into an f32 template tensor.
#include "compat.h"

inline float wval(device const char* q, uint i) { return float(q[i]); }
inline float wval(device const ushort* b, uint i) { return bits_to_float(uint(b[i]) << 16); }
inline float wval(device const float* w, uint i) { return w[i]; }

template <typename T>
inline float dense_dot(device const T* w, device const float* x, uint cols) {
    float acc[16];
    for (uint j = 0; j < 16; j++) acc[j] = 0.0f;
    uint full = cols - cols % 16;
    for (uint c = 0; c < full; c += 16) {
        for (uint j = 0; j < 16; j++) {
            float p = wval(w, c + j) * x[c + j];
            acc[j] = acc[j] + p;
        }
    }
    for (uint j = 0; j < cols - full; j++) {
        float p = wval(w, full + j) * x[full + j];
        acc[j] = acc[j] + p;
    }
    for (uint w2 = 8; w2 > 0; w2 /= 2) {
        for (uint i = 0; i < w2; i++) acc[i] = acc[i] + acc[i + w2];
    }
    return acc[0];
}

kernel void int8_dequant(device const char* q [[buffer(0)]],
                         device const ushort* scales [[buffer(1)]],
                         device float* out [[buffer(2)]],
                         constant uint& rows [[buffer(3)]],
                         constant uint& cols [[buffer(4)]],
                         uint i [[thread_position_in_grid]]) {
    if (i >= rows * cols) return;
    out[i] = float(q[i]) * f16_bits_to_float(scales[i / cols]);
}

kernel void int8_gemv(device const char* q [[buffer(0)]],
                      device const ushort* scales [[buffer(1)]],
                      device const float* x [[buffer(2)]],
                      device float* y [[buffer(3)]],
                      constant uint& rows [[buffer(4)]],
                      constant uint& cols [[buffer(5)]],
                      constant uint& tokens [[buffer(6)]],
                      uint i [[thread_position_in_grid]]) {
    if (i >= rows * tokens) return;
    uint t = i / rows, r = i % rows;
    y[i] = dense_dot(q + ulong(r) * cols, x + ulong(t) * cols, cols) * f16_bits_to_float(scales[r]);
}

kernel void bf16_gemv(device const ushort* w [[buffer(0)]],
                      device const float* x [[buffer(1)]],
                      device float* y [[buffer(2)]],
                      constant uint& rows [[buffer(3)]],
                      constant uint& cols [[buffer(4)]],
                      constant uint& tokens [[buffer(5)]],
                      uint i [[thread_position_in_grid]]) {
    if (i >= rows * tokens) return;
    uint t = i / rows, r = i % rows;
    y[i] = dense_dot(w + ulong(r) * cols, x + ulong(t) * cols, cols);
}

kernel void f32_gemv(device const float* w [[buffer(0)]],
                     device const float* x [[buffer(1)]],
                     device float* y [[buffer(2)]],
                     constant uint& rows [[buffer(3)]],
                     constant uint& cols [[buffer(4)]],
                     constant uint& tokens [[buffer(5)]],
                     uint i [[thread_position_in_grid]]) {
    if (i >= rows * tokens) return;
    uint t = i / rows, r = i % rows;
    y[i] = dense_dot(w + ulong(r) * cols, x + ulong(t) * cols, cols);
}
