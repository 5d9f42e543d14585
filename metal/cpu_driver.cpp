// Runs the Metal kernels' bodies on the CPU over a simulated grid (one call per thread index),
// for the `shader_*` tests. Usage:
//   cpu_driver mxfp4 ROWS COLS packed scales x out
//   cpu_driver int8gemv ROWS COLS TOKENS q scales x out
//   cpu_driver bf16gemv|f32gemv ROWS COLS TOKENS w x out
//   cpu_driver int8deq ROWS COLS q scales out
//   cpu_driver experts INTER LATENT PAIRS BETA LINEAR_BETA stage base z out
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mxfp4.metal"
#include "dense.metal"

static std::vector<char> slurp(const char* p) {
    std::vector<char> v;
    FILE* f = std::fopen(p, "rb");
    if (!f) { std::perror(p); std::exit(2); }
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
    std::fclose(f);
    return v;
}

static void spit(const char* p, const std::vector<float>& v) {
    FILE* f = std::fopen(p, "wb");
    if (!f) { std::perror(p); std::exit(2); }
    std::fwrite(v.data(), sizeof(float), v.size(), f);
    std::fclose(f);
}

static uint arg_u(const char* a) { return (uint)std::strtoul(a, nullptr, 10); }

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    std::string k = argv[1];
    if (k == "mxfp4" && argc == 8) {
        uint rows = arg_u(argv[2]), cols = arg_u(argv[3]);
        auto p = slurp(argv[4]), s = slurp(argv[5]), x = slurp(argv[6]);
        std::vector<float> y(rows);
        for (uint r = 0; r < rows; r++)
            mxfp4_gemv((const uchar*)p.data(), (const uchar*)s.data(), (const float*)x.data(), y.data(), rows, cols, r);
        spit(argv[7], y);
    } else if (k == "int8gemv" && argc == 9) {
        uint rows = arg_u(argv[2]), cols = arg_u(argv[3]), tokens = arg_u(argv[4]);
        auto q = slurp(argv[5]), s = slurp(argv[6]), x = slurp(argv[7]);
        std::vector<float> y((size_t)rows * tokens);
        for (uint i = 0; i < rows * tokens; i++)
            int8_gemv(q.data(), (const ushort*)s.data(), (const float*)x.data(), y.data(), rows, cols, tokens, i);
        spit(argv[8], y);
    } else if ((k == "bf16gemv" || k == "f32gemv") && argc == 8) {
        uint rows = arg_u(argv[2]), cols = arg_u(argv[3]), tokens = arg_u(argv[4]);
        auto w = slurp(argv[5]), x = slurp(argv[6]);
        std::vector<float> y((size_t)rows * tokens);
        for (uint i = 0; i < rows * tokens; i++) {
            if (k == "bf16gemv")
                bf16_gemv((const ushort*)w.data(), (const float*)x.data(), y.data(), rows, cols, tokens, i);
            else
                f32_gemv((const float*)w.data(), (const float*)x.data(), y.data(), rows, cols, tokens, i);
        }
        spit(argv[7], y);
    } else if (k == "int8deq" && argc == 7) {
        uint rows = arg_u(argv[2]), cols = arg_u(argv[3]);
        auto q = slurp(argv[4]), s = slurp(argv[5]);
        std::vector<float> y((size_t)rows * cols);
        for (uint i = 0; i < rows * cols; i++) int8_dequant(q.data(), (const ushort*)s.data(), y.data(), rows, cols, i);
        spit(argv[6], y);
    } else if (k == "experts" && argc == 11) {
        // experts INTER LATENT PAIRS BETA LINEAR_BETA stage base z out
        uint inter = arg_u(argv[2]), latent = arg_u(argv[3]), pairs = arg_u(argv[4]);
        float beta = std::strtof(argv[5], nullptr), lbeta = std::strtof(argv[6], nullptr);
        auto st = slurp(argv[7]), b = slurp(argv[8]), z = slurp(argv[9]);
        std::vector<float> h((size_t)inter * pairs), y((size_t)latent * pairs);
        for (uint i = 0; i < inter * pairs; i++)
            mxfp4_experts_gate_up((const uchar*)st.data(), (const ulong*)b.data(), (const float*)z.data(), h.data(),
                                  inter, latent, pairs, beta, lbeta, i);
        for (uint i = 0; i < latent * pairs; i++)
            mxfp4_experts_down((const uchar*)st.data(), (const ulong*)b.data(), h.data(), y.data(), inter, latent,
                               pairs, i);
        spit(argv[10], y);
    } else {
        return 2;
    }
    return 0;
}
