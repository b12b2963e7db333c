// The repacked Q4_1x16 / Q8_0x16 kernels at SmolLM2-135M shapes, one thread, weights in cache: time and
// GOP/s per ISA and rows of x (see README.md here).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "kernels/quant_linear.h"
using namespace pagedcore::kernels;
int main(int argc, char** argv) {
  const int64_t K = 576;
  struct Case { const char* name; WeightFormat f; int64_t bytes_per_block16; int64_t N; };
  Case cases[] = {{"q4_1x16 qkv", WeightFormat::kQ4_1x16, 16 * 20, 576},
                  {"q4_1x16 gate_up", WeightFormat::kQ4_1x16, 16 * 20, 3072},
                  {"q8_0x16 qkv", WeightFormat::kQ8_0x16, 16 * 34, 576}};
  const QuantIsaKernels* isas[] = {&quant_avx512_vnni::quant_kernels(), &quant_avx2::quant_kernels()};
  const char* isa_names[] = {"avx512_vnni", "avx2"};
  std::mt19937 rng(0);
  for (int M : {1, 16, 128}) for (auto& c : cases) for (int i = 0; i < 2; ++i) {
    QuantBlockFn fn = isas[i]->formats[static_cast<int>(c.f)];
    if (!fn) continue;
    const int64_t nb = K / 32;
    std::vector<uint8_t> w(c.N / 16 * nb * c.bytes_per_block16);
    for (auto& b : w) b = rng();
    // fp16 scales: blocks begin with d[16] (and m[16] for q4_1)
    for (size_t off = 0; off < w.size(); off += c.bytes_per_block16) {
      uint16_t* h = reinterpret_cast<uint16_t*>(&w[off]);
      for (int k = 0; k < (c.f == WeightFormat::kQ4_1x16 ? 32 : 16); ++k) h[k] = 0x2000;
    }
    int64_t qs = 640;
    std::vector<int8_t> q(M * qs);
    for (auto& b : q) b = static_cast<int8_t>(rng() % 255 - 127);
    std::vector<float> d(M * nb, 0.01f), s(M * nb, 0.5f), dst(M * c.N);
    QuantBlockArgs a;
    a.x.q = q.data(); a.x.q_stride = qs; a.x.d = d.data(); a.x.d_stride = nb; a.x.s = s.data(); a.x.s_stride = nb;
    a.w = w.data(); a.row_bytes = nb * c.bytes_per_block16 / 16; a.K = K; a.n_outer = M <= 4;
    const int iters = M >= 16 ? 4 : 100;
    double best = 1e9;
    for (int rep = 0; rep < 30; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < iters; ++it) fn(a, 0, M, 0, c.N, dst.data(), c.N);
      auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
    }
    printf("%-16s %-12s M=%d  %9.2f us  GOP/s %6.1f  (dst0 %g)\n", c.name, isa_names[i], M, best,
           2.0 * M * c.N * K / best / 1e3, dst[0]);
  }
}
