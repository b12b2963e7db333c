// How fast one thread reads a decode step's K/V from DRAM when it lies in 2 KB planes of scattered
// blocks (a paged cache: one kv head's [16 tokens, 64 dims] bf16 plane per block) against the same
// bytes read contiguously, each after a 96 MB read that evicts them. Optionally with a software
// prefetch of the plane `ahead` planes on, one line beside each line read.
//   scattered_reads [ahead=0] [bytes=393216]     (384 KB: 512 tokens x 3 kv heads x 64 dims x 2 x bf16)
// Build: g++ -O2 -mavx512f -std=c++17 bench/micro/scattered_reads.cc -o /tmp/scattered_reads
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const int ahead = argc > 1 ? std::atoi(argv[1]) : 0;
  const size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 393216;
  constexpr size_t kPlane = 2048, kBlock = 3 * kPlane;  // a block holds 3 kv heads' planes
  constexpr size_t kSpace = 512ull << 20;               // a 512 MB cache
  const size_t num_planes = bytes / kPlane;
  std::vector<char> cache(kSpace, 1);                   // every page touched: resident
  std::vector<float> evict(24 << 20, 1.f);              // 96 MB
  std::vector<size_t> plane_at(num_planes);             // [num_planes] byte offsets, scattered blocks
  for (size_t i = 0; i < num_planes; ++i) plane_at[i] = (i * 40009ull) % (kSpace / kBlock) * kBlock;
  volatile float sink = 0;
  std::vector<double> contiguous_us, scattered_us;
  auto evict_caches = [&] {
    float s = 0;
    for (size_t j = 0; j < evict.size(); j += 16) s += evict[j];
    sink = sink + s;
  };
  for (int round = 0; round < 200; ++round) {
    __m512i acc = _mm512_setzero_si512();
    evict_caches();
    const auto t0 = Clock::now();
    for (size_t b = 0; b < num_planes * kPlane; b += 64)
      acc = _mm512_add_epi32(acc, _mm512_loadu_si512(cache.data() + 8192 + b));
    const auto t1 = Clock::now();
    evict_caches();
    const auto t2 = Clock::now();
    for (size_t p = 0; p < num_planes; ++p) {
      const char* plane = cache.data() + plane_at[p];
      const char* next = ahead > 0 && p + ahead < num_planes ? cache.data() + plane_at[p + ahead] : nullptr;
      for (size_t b = 0; b < kPlane; b += 64) {
        if (next) _mm_prefetch(next + b, _MM_HINT_T1);
        acc = _mm512_add_epi32(acc, _mm512_loadu_si512(plane + b));
      }
    }
    const auto t3 = Clock::now();
    sink = sink + _mm512_reduce_add_epi32(acc);
    contiguous_us.push_back(std::chrono::duration<double>(t1 - t0).count() * 1e6);
    scattered_us.push_back(std::chrono::duration<double>(t3 - t2).count() * 1e6);
  }
  std::sort(contiguous_us.begin(), contiguous_us.end());
  std::sort(scattered_us.begin(), scattered_us.end());
  const double c = contiguous_us[100], s = scattered_us[100];  // medians
  std::printf("%zu KB, prefetch %d planes ahead: contiguous %.1f us (%.1f GB/s), 2 KB planes of scattered "
              "blocks %.1f us (%.1f GB/s)\n", bytes / 1024, ahead, c, bytes / c / 1e3, s, bytes / s / 1e3);
  return 0;
}
