// One token's 120 Q4_1x16 linears (SmolLM2-135M shapes, 30 layers, distinct weights) through linear(),
// M = 1, vs a contiguous read of the same bytes and vs the same 120 reads without compute (see README.md).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <algorithm>
#include "kernels/linear.h"
#include "kernels/parallel.h"
using namespace pagedcore::kernels;
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
namespace pagedcore { namespace kernels { float read_probe(const void* data, int64_t bytes, int threads); } }
int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "pool") == 0) set_active_threading(Threading::kPool);
  // argv[3]: the weight format, q4_1 (default) or q8_0 (16-row groups of 320 / 544 bytes a 32-weight block)
  const bool q8 = argc > 3 && strcmp(argv[3], "q8_0") == 0;
  const size_t group_bytes = q8 ? 544 : 320, scales = q8 ? 16 : 32;
  struct Shape { int64_t N, K; };
  const Shape shapes[4] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
  std::vector<std::vector<uint8_t>> ws;
  int64_t total = 0;
  for (int l = 0; l < 30; ++l)
    for (const Shape& s : shapes) {
      std::vector<uint8_t> w(s.N / 16 * (s.K / 32) * group_bytes);
      for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>(i * 7);
      for (size_t off = 0; off < w.size(); off += group_bytes) {  // finite fp16 scales (d, and m for Q4_1)
        uint16_t* h = reinterpret_cast<uint16_t*>(&w[off]);
        for (size_t k = 0; k < scales; ++k) h[k] = 0x2000;
      }
      total += w.size();
      ws.push_back(std::move(w));
    }
  std::vector<float> probe(total / 4, 1.0f);
  std::vector<float> x(1536, 0.5f), out(3072);
  auto token = [&]() {
    for (int l = 0; l < 30; ++l)
      for (int k = 0; k < 4; ++k) {
        const Shape& s = shapes[k];
        LinearParams p;
        p.out = out.data();
        p.x = x.data();
        p.weight = ws[l * 4 + k].data();
        p.M = 1;
        p.N = s.N;
        p.K = s.K;
        p.x_stride = s.K; p.out_stride = s.N; p.weight_format = q8 ? WeightFormat::kQ8_0x16 : WeightFormat::kQ4_1x16;
        linear(p);
      }
  };
  const int thr = argc > 2 ? atoi(argv[2]) : 0;
  auto split_read = [&]() {
    for (auto& w : ws) read_probe(w.data(), static_cast<int64_t>(w.size()), thr);
  };
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  if (argc > 4 && strcmp(argv[4], "repeat") == 0) {
    // The passes back to back, each kind 20 times in a row (as a multi-step call repeats a token's reads):
    // what stays in L3 from one pass to the next helps each kind alike.
    for (int round = 0; round < 4; ++round) {
      std::vector<double> a, b, c;
      for (int r = 0; r < 20; ++r) { double t0 = now(); token(); a.push_back(now() - t0); }
      for (int r = 0; r < 20; ++r) { double t0 = now(); read_probe(probe.data(), total, thr); b.push_back(now() - t0); }
      for (int r = 0; r < 20; ++r) { double t0 = now(); split_read(); c.push_back(now() - t0); }
      printf("repeated: token linears %.3f ms (%.1f GB/s), contiguous read %.3f ms (%.1f GB/s), per-op reads "
             "%.3f ms (%.1f GB/s)\n", med(a) * 1e3, total / med(a) / 1e9, med(b) * 1e3, total / med(b) / 1e9,
             med(c) * 1e3, total / med(c) / 1e9);
    }
    return 0;
  }
  token();
  std::vector<double> ratios, tt, tr, ts;
  for (int r = 0; r < 60; ++r) {
    read_probe(probe.data(), total, 0);
    double t0 = now(); token(); double t1 = now(); read_probe(probe.data(), total, thr); double t2 = now();
    split_read(); double t3 = now();
    tt.push_back(t1 - t0); tr.push_back(t2 - t1); ts.push_back(t3 - t2); ratios.push_back((t2 - t1) / (t1 - t0));
  }
  printf("%s: %.1f MB of linears: token linears %.3f ms, read %.3f ms (%.1f GB/s), median ratio %.2f; "
         "per-op reads %.3f ms\n",
         q8 ? "q8_0x16" : "q4_1x16", total / 1e6, med(tt) * 1e3, med(tr) * 1e3, total / med(tr) / 1e9, med(ratios),
         med(ts) * 1e3);
}
