// The attention tests' batch (test_kernels.cc, test_fp8_cache.cc): random sequences over shuffled,
// non-contiguous blocks of a paged cache, the naive double-precision attention over it, and the params
// of one paged_attention call.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/kernel_types.h"
#include "kernels/paged_attention.h"

namespace pagedcore_test {

using namespace pagedcore::kernels;

struct Batch {
  int64_t num_heads, num_kv_heads, head_size, block_size, num_blocks, max_blocks;
  std::vector<float> key_cache, value_cache;  // [num_blocks, num_kv_heads, block_size, head_size] fp32
  std::vector<uint16_t> key_cache_bf16, value_cache_bf16;
  std::vector<int32_t> block_tables, seq_lens, query_start_loc;
  std::vector<float> query;  // [num_tokens, num_heads, head_size]
  int64_t kv_block_stride = 0;  // elements between blocks; 0 = num_kv_heads * block_size * head_size
  std::vector<uint8_t> key_cache_fp8, value_cache_fp8;  // with_fp8_cache: the fp32 cache's values as fp8
  int64_t num_tokens() const { return query_start_loc.back(); }
  // Element (block, g, row, 0) of a cache.
  int64_t at(int64_t block, int64_t g, int64_t row) const {
    const int64_t stride = kv_block_stride ? kv_block_stride : num_kv_heads * block_size * head_size;
    return block * stride + (g * block_size + row) * head_size;
  }
};

// seqs: (context before this step, query rows). Unused cache slots hold NaN: reading one shows.
inline Batch make_batch(const std::vector<std::pair<int, int>>& seqs, int64_t num_heads, int64_t num_kv_heads,
                 int64_t head_size, int64_t block_size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Batch b{num_heads, num_kv_heads, head_size, block_size, 0, 0, {}, {}, {}, {}, {}, {}, {0}, {}};
  std::vector<int64_t> blocks_per_seq;
  for (auto [ctx, q] : seqs) {
    blocks_per_seq.push_back((ctx + q + block_size - 1) / block_size);
    b.max_blocks = std::max(b.max_blocks, blocks_per_seq.back() + 1);
    b.num_blocks += blocks_per_seq.back();
  }
  b.num_blocks += 5;
  std::vector<int32_t> ids(b.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int64_t plane = block_size * head_size;
  b.key_cache.assign(b.num_blocks * num_kv_heads * plane, std::numeric_limits<float>::quiet_NaN());
  b.value_cache = b.key_cache;
  b.block_tables.assign(seqs.size() * b.max_blocks, -1);
  size_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int seq_len = seqs[s].first + seqs[s].second;
    for (int64_t i = 0; i < blocks_per_seq[s]; ++i) b.block_tables[s * b.max_blocks + i] = ids[next++];
    for (int pos = 0; pos < seq_len; ++pos) {
      const int64_t block = b.block_tables[s * b.max_blocks + pos / block_size];
      for (int64_t g = 0; g < num_kv_heads; ++g)
        for (int64_t d = 0; d < head_size; ++d) {
          const int64_t at = ((block * num_kv_heads + g) * block_size + pos % block_size) * head_size + d;
          // bf16-representable values, so the fp32 and bf16 caches hold the same numbers
          b.key_cache[at] = bf16_to_float(float_to_bf16(normal(rng)));
          b.value_cache[at] = bf16_to_float(float_to_bf16(normal(rng)));
        }
    }
    b.seq_lens.push_back(seq_len);
    b.query_start_loc.push_back(b.query_start_loc.back() + seqs[s].second);
  }
  for (float f : b.key_cache) b.key_cache_bf16.push_back(float_to_bf16(f));
  for (float f : b.value_cache) b.value_cache_bf16.push_back(float_to_bf16(f));
  b.query.resize(b.num_tokens() * num_heads * head_size);
  for (float& f : b.query) f = normal(rng);
  return b;
}

// The obvious triple loop, in double.
inline std::vector<float> naive_attention(const Batch& b, float scale) {
  std::vector<float> out(b.query.size(), 0.f);
  const int64_t D = b.head_size, group = b.num_heads / b.num_kv_heads;
  for (size_t s = 0; s + 1 < b.query_start_loc.size(); ++s) {
    const int q_len = b.query_start_loc[s + 1] - b.query_start_loc[s];
    for (int j = 0; j < q_len; ++j) {
      const int64_t token = b.query_start_loc[s] + j;
      const int64_t pos = b.seq_lens[s] - q_len + j;
      for (int64_t h = 0; h < b.num_heads; ++h) {
        const int64_t g = h / group;
        std::vector<double> score(pos + 1);
        double mx = -1e300;
        for (int64_t k = 0; k <= pos; ++k) {
          const int64_t block = b.block_tables[s * b.max_blocks + k / b.block_size];
          const float* key = &b.key_cache[b.at(block, g, k % b.block_size)];
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(b.query[(token * b.num_heads + h) * D + d]) * key[d];
          score[k] = dot * scale;
          mx = std::max(mx, score[k]);
        }
        double sum = 0;
        for (double& x : score) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t k = 0; k <= pos; ++k) {
            const int64_t block = b.block_tables[s * b.max_blocks + k / b.block_size];
            acc += score[k] * b.value_cache[b.at(block, g, k % b.block_size) + d];
          }
          out[(token * b.num_heads + h) * D + d] = static_cast<float>(acc / sum);
        }
      }
    }
  }
  return out;
}

inline PagedAttentionParams params_for(const Batch& b, DType cache_dtype, void* out, float scale) {
  PagedAttentionParams p;
  p.out = out;
  p.query = b.query.data();
  const bool bf16 = cache_dtype == DType::kBFloat16, fp8 = is_fp8(cache_dtype);
  p.key_cache = fp8 ? static_cast<const void*>(b.key_cache_fp8.data())
                    : bf16 ? static_cast<const void*>(b.key_cache_bf16.data()) : b.key_cache.data();
  p.value_cache = fp8 ? static_cast<const void*>(b.value_cache_fp8.data())
                      : bf16 ? static_cast<const void*>(b.value_cache_bf16.data()) : b.value_cache.data();
  p.block_tables = b.block_tables.data();
  p.seq_lens = b.seq_lens.data();
  p.query_start_loc = b.query_start_loc.data();
  p.num_seqs = static_cast<int64_t>(b.seq_lens.size());
  p.num_tokens = b.num_tokens();
  p.num_heads = b.num_heads;
  p.num_kv_heads = b.num_kv_heads;
  p.head_size = b.head_size;
  p.num_blocks = b.num_blocks;
  p.block_size = b.block_size;
  p.max_blocks_per_seq = b.max_blocks;
  p.kv_block_stride = b.kv_block_stride;
  p.q_stride_token = b.num_heads * b.head_size;
  p.q_stride_head = b.head_size;
  p.out_stride_token = b.num_heads * b.head_size;
  p.out_stride_head = b.head_size;
  p.cache_dtype = cache_dtype;
  p.scale = scale;
  return p;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= worst)) worst = d;  // NaN propagates
  }
  return worst;
}

inline const std::vector<std::pair<int, int>> kMixed = {{37, 1},  {0, 21},  {100, 1}, {5, 40},
                                                         {16, 16}, {250, 1}, {70, 33}};

}  // namespace pagedcore_test
