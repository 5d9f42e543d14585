// Runs the Metal kernels' bodies on the CPU over a simulated grid (one call per thread index),
// for the `shader_*` tests. Usage:
//   cpu_driver mxfp4 ROWS COLS packed scales x out
//   cpu_driver int8gemv ROWS COLS q scales x out
//   cpu_driver int8deq ROWS COLS q scales out
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mxfp4.metal"
#include "int8.metal"

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

int main(int argc, char** argv) {
    if (argc < 4) return 2;
    std::string k = argv[1];
    uint rows = std::strtoul(argv[2], nullptr, 10), cols = std::strtoul(argv[3], nullptr, 10);
    if (k == "mxfp4" && argc == 8) {
        auto p = slurp(argv[4]), s = slurp(argv[5]), x = slurp(argv[6]);
        std::vector<float> y(rows);
        for (uint r = 0; r < rows; r++)
            mxfp4_gemv((const uchar*)p.data(), (const uchar*)s.data(), (const float*)x.data(), y.data(), rows, cols, r);
        spit(argv[7], y);
    } else if (k == "int8gemv" && argc == 8) {
        auto q = slurp(argv[4]), s = slurp(argv[5]), x = slurp(argv[6]);
        std::vector<float> y(rows);
        for (uint r = 0; r < rows; r++)
            int8_gemv(q.data(), (const ushort*)s.data(), (const float*)x.data(), y.data(), rows, cols, r);
        spit(argv[7], y);
    } else if (k == "int8deq" && argc == 7) {
        auto q = slurp(argv[4]), s = slurp(argv[5]);
        std::vector<float> y((size_t)rows * cols);
        for (uint i = 0; i < rows * cols; i++) int8_dequant(q.data(), (const ushort*)s.data(), y.data(), rows, cols, i);
        spit(argv[6], y);
    } else {
        return 2;
    }
    return 0;
}
