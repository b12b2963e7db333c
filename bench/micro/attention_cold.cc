// Where a decode attention call's time goes when its K/V come from DRAM, as in a decode step (SmolLM2 shapes:
// 9 query heads over 3 kv heads, head_dim 64, bf16, a block-major cache of 30 layers, 8 blocks at ctx 128).
//   attention_cold [context=128] [pool]
// Per layer call, median of 200 (us):
//   warm         the same call again (everything in cache)
//   engine-like  the call's K/V untouched since an 80 MB read, a 3 MB read (a layer's weights) just before it
//   pages        a line of every K/V page read on both threads first (TLB warm, data in DRAM), 80 MB read before
//   lines        every K/V line read on both threads first (data in both cores' caches), 80 MB read before
//   overlap      a 310 KB stream (qkv_proj's weights) with or without the call's K/V prefetched by both threads
//                inside it, then the call: stream + attention
// Build as README.md says.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/paged_attention.h"
#include "kernels/parallel.h"

using namespace pagedcore::kernels;

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
volatile float g_sink;
double med(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2] * 1e6;
}
// Reads `floats` of `buf` from `at`, halves on the two threads.
void stream(const std::vector<float>& buf, size_t at, size_t floats) {
  parallel_for(2, [&](int t, int) {
    float s = 0;
    for (size_t i = at + t * floats / 2; i < at + (t + 1) * floats / 2; i += 16) s += buf[i];
    g_sink = s;
  });
}
}  // namespace

int main(int argc, char** argv) {
  const int context = argc > 1 ? std::atoi(argv[1]) : 128;
  if (argc > 2 && std::strcmp(argv[2], "pool") == 0) set_active_threading(Threading::kPool);
  constexpr int L = 30, H = 9, Hkv = 3, D = 64, BS = 16, NB = 64;
  if (context < 1 || context > NB * BS) return 1;
  const int64_t plane = Hkv * BS * D;          // one layer's K (or V) of a block, elements
  const int64_t block_stride = L * 2 * plane;  // block-major: [blocks, layers, 2, kv heads, 16, D]
  const int blocks = (context + BS - 1) / BS;
  std::vector<uint16_t> cache(NB * block_stride, 0x3f80);  // bf16 1.0
  std::vector<float> big(80 << 18, 1.f), layer_weights(3 << 18, 1.f), weights(64 << 18, 1.f);
  std::vector<float> query(H * D, 0.1f), out(H * D);
  std::vector<int32_t> block_table(NB);
  for (int i = 0; i < NB; ++i) block_table[i] = (i * 37) % NB;
  const int32_t seq_len = context, query_start_loc[2] = {0, 1};
  PagedAttentionParams p;
  p.out = out.data();
  p.query = query.data();
  p.block_tables = block_table.data();
  p.seq_lens = &seq_len;
  p.query_start_loc = query_start_loc;
  p.num_seqs = p.num_tokens = 1;
  p.num_heads = H;
  p.num_kv_heads = Hkv;
  p.head_size = D;
  p.num_blocks = NB;
  p.kv_block_stride = block_stride;
  p.block_size = BS;
  p.max_blocks_per_seq = NB;
  p.q_stride_token = p.out_stride_token = H * D;
  p.q_stride_head = p.out_stride_head = D;
  p.q_dtype = DType::kFloat32;
  p.cache_dtype = DType::kBFloat16;
  p.scale = 0.125f;
  p.max_query_len = 1;
  p.max_seq_len = context;
  auto layer = [&](int l) {
    p.key_cache = cache.data() + l * 2 * plane;
    p.value_cache = cache.data() + l * 2 * plane + plane;
  };
  auto kv_bytes = [&](int l, int b) {  // layer l's K and V planes of the sequence's b-th block
    return reinterpret_cast<const char*>(cache.data() + block_table[b] * block_stride + l * 2 * plane);
  };
  auto touch_both = [&](int l, int64_t step_bytes) {  // each thread reads every K/V line (or page) of layer l
    parallel_for(2, [&](int, int) {
      float s = 0;
      for (int b = 0; b < blocks; ++b)
        for (int64_t i = 0; i < 2 * plane * 2; i += step_bytes) s += kv_bytes(l, b)[i];
      g_sink = s;
    });
  };
  size_t weights_at = 0;
  const size_t qkv_floats = 310 * 1024 / 4;
  auto qkv_like = [&](int l, bool prefetch_kv) {
    if (weights_at + qkv_floats > weights.size()) weights_at = 0;
    parallel_for(2, [&](int t, int) {
      if (prefetch_kv)
        for (int b = 0; b < blocks; ++b)
          for (int64_t i = 0; i < 2 * plane * 2; i += 64) __builtin_prefetch(kv_bytes(l, b) + i, 0, 3);
      float s = 0;
      const size_t begin = weights_at + t * qkv_floats / 2, end = begin + qkv_floats / 2;
      for (size_t i = begin; i < end; i += 16) s += weights[i];
      g_sink = s;
    });
    weights_at += qkv_floats;
  };
  for (int round = 0; round < 3; ++round) {
    std::vector<double> warm, engine, pages, lines, s0, a0, s1, a1;
    for (int it = 0; it < 200; ++it) {
      const int l = it % L;
      layer(l);
      stream(big, 0, big.size());
      double t0 = now();
      paged_attention(p);
      t0 = now();
      paged_attention(p);
      warm.push_back(now() - t0);
      layer((l + 1) % L);  // untouched since the 80 MB read of an earlier iteration
      stream(layer_weights, 0, layer_weights.size());
      t0 = now();
      paged_attention(p);
      engine.push_back(now() - t0);
      layer((l + 2) % L);
      stream(big, 0, big.size());
      touch_both((l + 2) % L, 4096);
      t0 = now();
      paged_attention(p);
      pages.push_back(now() - t0);
      stream(big, 0, big.size());
      touch_both((l + 2) % L, 64);
      t0 = now();
      paged_attention(p);
      lines.push_back(now() - t0);
      for (int prefetch = 0; prefetch < 2; ++prefetch) {
        const int lo = (l + 10 + 10 * prefetch) % L;
        layer(lo);
        stream(layer_weights, 0, layer_weights.size());
        t0 = now();
        qkv_like(lo, prefetch == 1);
        const double t1 = now();
        paged_attention(p);
        (prefetch ? s1 : s0).push_back(t1 - t0);
        (prefetch ? a1 : a0).push_back(now() - t1);
      }
    }
    std::printf("ctx %d (%s): warm %.2f us, engine-like %.2f, pages %.2f, lines %.2f; overlap: stream %.2f + "
                "attention %.2f = %.2f, with K/V prefetched in the stream %.2f + %.2f = %.2f\n",
                context, active_threading() == Threading::kPool ? "pool" : "openmp", med(warm), med(engine),
                med(pages), med(lines), med(s0), med(a0), med(s0) + med(a0), med(s1), med(a1), med(s1) + med(a1));
  }
  return 0;
}
