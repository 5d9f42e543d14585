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

// SiTU in Kimi's operation order (src/mxfp4/expert.rs):
// ((tanh(g/β)·β)·σ(g)) · (tanh(u/β_lin)·β_lin).
inline float situ(float g, float u, float beta, float linear_beta) {
    float sig = 1.0f / (1.0f + exp(-g));
    float gate = (tanh(g / beta) * beta) * sig;
    float up = tanh(u / linear_beta) * linear_beta;
    return gate * up;
}

// One layer's selected experts in one dispatch each way. `stage` holds the experts' raw spans
// (w1 gate, w2 down, w3 up; each packed codes then E8M0 scales); pair p = (expert, input row)
// reads its span at byte `base[p]` and its latent input row `z[p]`.
// Step 1: h[p][r] = SiTU(w1[r]·z[p], w3[r]·z[p]) for r < inter.
kernel void mxfp4_experts_gate_up(device const uchar* stage [[buffer(0)]],
                                  device const ulong* base [[buffer(1)]],
                                  device const float* z [[buffer(2)]],
                                  device float* h [[buffer(3)]],
                                  constant uint& inter [[buffer(4)]],
                                  constant uint& latent [[buffer(5)]],
                                  constant uint& pairs [[buffer(6)]],
                                  constant float& beta [[buffer(7)]],
                                  constant float& linear_beta [[buffer(8)]],
                                  uint i [[thread_position_in_grid]]) {
    if (i >= inter * pairs) return;
    uint p = i / inter, r = i % inter;
    ulong packed = ulong(inter) * latent / 2, scales = ulong(inter) * latent / 32;
    device const uchar* w1 = stage + base[p];
    device const uchar* w3 = w1 + 2 * (packed + scales);
    uint groups = latent / 32;
    device const float* zp = z + ulong(p) * latent;
    float g = mxfp4_row_dot(w1 + ulong(r) * (latent / 2), w1 + packed + ulong(r) * groups, zp, groups);
    float u = mxfp4_row_dot(w3 + ulong(r) * (latent / 2), w3 + packed + ulong(r) * groups, zp, groups);
    h[i] = situ(g, u, beta, linear_beta);
}

// Step 2: y[p][r] = w2[r]·h[p] for r < latent.
kernel void mxfp4_experts_down(device const uchar* stage [[buffer(0)]],
                               device const ulong* base [[buffer(1)]],
                               device const float* h [[buffer(2)]],
                               device float* y [[buffer(3)]],
                               constant uint& inter [[buffer(4)]],
                               constant uint& latent [[buffer(5)]],
                               constant uint& pairs [[buffer(6)]],
                               uint i [[thread_position_in_grid]]) {
    if (i >= latent * pairs) return;
    uint p = i / latent, r = i % latent;
    ulong packed = ulong(inter) * latent / 2, scales = ulong(inter) * latent / 32;
    device const uchar* w2 = stage + base[p] + packed + scales;
    uint groups = inter / 32;
    y[i] = mxfp4_row_dot(w2 + ulong(r) * (inter / 2), w2 + packed + ulong(r) * groups,
                         h + ulong(p) * inter, groups);
}
