// Fused MXFP4 dequant + GEMV, one thread per output row, in the crate's fixed reduction order
// (src/mxfp4/kernels.rs): lane j of 32 accumulates w[32g+j]·x[32g+j] with one FMA per group;
// lanes are then summed as 8 accumulators of 4, ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)), and the
// 4 lanes as (l0+l1)+(l2+l3). The E2M1 value times the E8M0 scale is exact.
#include "compat.h"

constant float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                           -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

inline float mxfp4_row_dot(device const uchar* packed, device const uchar* scales,
                           device const float* x, uint groups) {
    float acc[32];
    for (uint j = 0; j < 32; j++) acc[j] = 0.0f;
    for (uint g = 0; g < groups; g++) {
        float sc = bits_to_float(uint(scales[g]) << 23);
        for (uint j = 0; j < 32; j++) {
            uchar b = packed[16 * g + j / 2];
            uint nib = (j & 1) ? uint(b >> 4) : uint(b & 15);
            float w = E2M1[nib] * sc;
            acc[j] = fma(w, x[32 * g + j], acc[j]);
        }
    }
    float s[4];
    for (uint i = 0; i < 4; i++) {
        s[i] = ((acc[i] + acc[4 + i]) + (acc[8 + i] + acc[12 + i])) +
               ((acc[16 + i] + acc[20 + i]) + (acc[24 + i] + acc[28 + i]));
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

kernel void mxfp4_gemv(device const uchar* packed [[buffer(0)]],
                       device const uchar* scales [[buffer(1)]],
                       device const float* x [[buffer(2)]],
                       device float* y [[buffer(3)]],
                       constant uint& rows [[buffer(4)]],
                       constant uint& cols [[buffer(5)]],
                       uint row [[thread_position_in_grid]]) {
    if (row >= rows) return;
    uint groups = cols / 32;
    y[row] = mxfp4_row_dot(packed + row * (cols / 2), scales + row * groups, x, groups);
}
