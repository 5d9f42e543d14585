// Lets the shader bodies in this directory compile as plain C++ (for the `shader_*` tests that
// run them on the CPU against the Rust reference kernels). Under Metal it only adds the f16 helper.
#pragma once

#ifdef __METAL_VERSION__
#include <metal_stdlib>
using namespace metal;
inline float f16_bits_to_float(ushort h) { return float(as_type<half>(h)); }
inline float bits_to_float(uint b) { return as_type<float>(b); }
#else
#include <cmath>
#include <cstdint>
#include <cstring>
typedef uint8_t uchar;
typedef uint16_t ushort;
typedef uint32_t uint;
typedef uint64_t ulong;
#define kernel
#define device
#define thread
#define constant const
using std::exp;
using std::fma;
// Metal's `tanh` is its own (on a Mac it differs from any libm); here it stands in as the Rust
// side's (`mxfp4::expert::tanh`: f64, rounded once), so the tests compare the shaders' order of
// operations with identical primitives. A macro, not a `tanh(float)` overload: libc++ already
// declares one in the global namespace.
inline float deltafin_tanh(float x) { return float(std::tanh(double(x))); }
#define tanh deltafin_tanh
inline float bits_to_float(uint b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
// IEEE half → float, exact (normals, subnormals, zero, inf, NaN).
inline float f16_bits_to_float(ushort h) {
    uint sign = uint(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        float v = std::ldexp(float(man), -24);
        return sign ? -v : v;
    }
    if (exp == 31) return bits_to_float(sign | 0x7f800000u | (man << 13));
    return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}
#endif
