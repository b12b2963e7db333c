// How fast one thread reads a fixed number of bytes from DRAM when they lie in scattered regions of R bytes,
// for R from a 2 KB plane (one kv head's 16 tokens of bf16 K in a paged cache) up to one contiguous run:
// the question behind the CPU default block size (a head's keys of a block are block_size x head_dim x
// the element size in one run). Each pass follows a 96 MB read that evicts the regions; median of 30.
//   region_reads [bytes=393216]     (384 KB: a decode step's K/V of 512 tokens, 3 kv heads, bf16)
// Build: g++ -O2 -mavx512f -std=c++17 bench/micro/region_reads.cc -o /tmp/region_reads
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 393216;
  constexpr size_t kSpace = 1024ull << 20;                 // a 1 GB cache, every page touched: resident
  constexpr size_t kGap = 360 * 1024;                      // between regions: a block of 30 layers' K/V
  std::vector<char> cache(kSpace, 1);
  std::vector<float> evict(24 << 20, 1.f);                 // 96 MB
  volatile float sink = 0;
  for (size_t region : {2048ul, 4096ul, 6144ul, 12288ul, 16384ul, 24576ul, 49152ul, bytes}) {
    const size_t num_regions = bytes / region;
    std::vector<size_t> at(num_regions);                   // [num_regions] byte offsets, scattered
    const size_t slots = kSpace / (region + kGap);
    for (size_t i = 0; i < num_regions; ++i) at[i] = (i * 40009ull) % slots * (region + kGap);
    std::vector<double> us;
    for (int rep = 0; rep < 30; ++rep) {
      float s = 0;
      for (size_t i = 0; i < evict.size(); i += 16) s += evict[i];
      sink = sink + s;
      const auto t0 = Clock::now();
      __m512i acc = _mm512_setzero_si512();
      for (size_t i = 0; i < num_regions; ++i) {
        const char* p = cache.data() + at[i];
        for (size_t off = 0; off < region; off += 64) acc = _mm512_add_epi32(acc, _mm512_loadu_si512(p + off));
      }
      sink = sink + static_cast<float>(_mm512_reduce_add_epi32(acc));
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    std::printf("regions of %6zu B x %4zu: median %7.1f us  %5.1f GB/s\n", region, num_regions, us[15],
                num_regions * region / us[15] / 1e3);
  }
}
