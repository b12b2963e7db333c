// A decode token's K/V reads for one sequence in two cache layouts, as the decoder stack reaches them:
// 30 layers, `num_blocks` blocks of 16 tokens at scattered ids, 3 kv heads, head_dim 64, bf16, with a
// 2 MB read of other data (a layer's weights) before each layer and a 96 MB eviction before the token.
//   layer-major [layers, 2, blocks, kv heads, 16, D]  (a GPU cache; the CPU cache until 2026-12-04)
//   block-major [blocks, layers, 2, kv heads, 16, D]  (the CPU cache since: a block's planes of every layer together)
// Time of the K/V reads only, median of 40 tokens, one thread.
//   kv_layout_reads [num_blocks=32] [prefetch planes ahead=0]
// Build: g++ -O2 -mavx512f -std=c++17 bench/micro/kv_layout_reads.cc -o /tmp/kv_layout_reads
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const size_t num_blocks = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 32;
  const size_t ahead = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 0;
  constexpr size_t kPlane = 2048, kLayers = 30, kHeads = 3;
  constexpr size_t kCacheBlocks = 1456;  // a 512 MB cache
  std::vector<char> cache(kCacheBlocks * kLayers * 2 * kHeads * kPlane, 1), weights(64 << 20, 1);
  std::vector<float> evict(24 << 20, 1.f);  // 96 MB
  std::vector<size_t> block_table(num_blocks);  // [num_blocks] scattered block ids
  for (size_t i = 0; i < num_blocks; ++i) block_table[i] = (i * 977 + 13) % kCacheBlocks;
  // Byte offset of plane (layer, k or v, block, kv head) in each layout.
  auto layer_major = [](size_t l, size_t kv, size_t b, size_t g) {
    return ((l * 2 + kv) * kCacheBlocks + b) * kHeads * kPlane + g * kPlane;
  };
  auto block_major = [](size_t l, size_t kv, size_t b, size_t g) {
    return ((b * kLayers + l) * 2 + kv) * kHeads * kPlane + g * kPlane;
  };
  volatile float sink = 0;
  std::vector<double> us[2];
  for (int token = 0; token < 40; ++token) {
    for (int layout = 0; layout < 2; ++layout) {
      auto at = [&](size_t l, size_t kv, size_t i, size_t g) {
        return cache.data() + (layout ? block_major : layer_major)(l, kv, block_table[i], g);
      };
      float s = 0;
      for (size_t j = 0; j < evict.size(); j += 16) s += evict[j];
      sink = sink + s;
      __m512i acc = _mm512_setzero_si512();
      double seconds = 0;
      size_t weight_at = 0;
      for (size_t l = 0; l < kLayers; ++l) {
        for (size_t j = 0; j < (2u << 20); j += 64, weight_at = (weight_at + 64) % weights.size())
          acc = _mm512_add_epi32(acc, _mm512_loadu_si512(weights.data() + weight_at));
        const auto t0 = Clock::now();
        for (size_t g = 0; g < kHeads; ++g)
          for (size_t kv = 0; kv < 2; ++kv)
            for (size_t i = 0; i < num_blocks; ++i) {
              const char* plane = at(l, kv, i, g);
              const char* next = ahead && i + ahead < num_blocks ? at(l, kv, i + ahead, g) : nullptr;
              for (size_t b = 0; b < kPlane; b += 64) {
                if (next) _mm_prefetch(next + b, _MM_HINT_T1);
                acc = _mm512_add_epi32(acc, _mm512_loadu_si512(plane + b));
              }
            }
        seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      }
      sink = sink + _mm512_reduce_add_epi32(acc);
      us[layout].push_back(seconds * 1e6);
    }
  }
  for (auto& v : us) std::sort(v.begin(), v.end());
  const double bytes = 1.0 * kLayers * num_blocks * 2 * kHeads * kPlane;
  std::printf("%zu blocks, prefetch %zu ahead: layer-major %.0f us (%.1f GB/s), block-major %.0f us (%.1f GB/s), "
              "a token's K/V over 30 layers\n", num_blocks, ahead, us[0][20], bytes / us[0][20] / 1e3, us[1][20],
              bytes / us[1][20] / 1e3);
  return 0;
}
