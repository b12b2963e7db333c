// Would a head-interleaved block layout ([blocks, layers, kv heads, K|V, 16, D]: a head's K and V planes in one
// 4 KB page, half the pages an item walks) make cold decode attention cheaper than the block-major cache
// ([blocks, layers, K|V, kv heads, 16, D])? Emulated with one call per kv head (num_kv_heads 1), both layouts
// the same way; the blocks rotate through 94 MB so the K/V come from DRAM, and a 3 MB read (a layer's weights)
// precedes each call. Median us of 300 (SmolLM2 shapes, bf16, partitions of 64 keys so both threads work).
//   attention_head_layout [context=128] [pool]
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
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static volatile float sink;
int main(int argc, char** argv) {
  const int context = argc > 1 ? atoi(argv[1]) : 128;
  if (argc > 2 && std::strcmp(argv[2], "pool") == 0) set_active_threading(Threading::kPool);
  constexpr int L = 30, H = 9, Hkv = 3, D = 64, BS = 16, NB = 256;
  const int64_t plane = Hkv * BS * D;          // a layer's K (or V) of one block
  const int64_t block_stride = L * 2 * plane;
  std::vector<uint16_t> cache(NB * block_stride + 4096, 0x3f80);
  uint16_t* base = cache.data() + (4096 - reinterpret_cast<uintptr_t>(cache.data()) % 4096) / 2;
  std::vector<float> query(H * D, 0.1f), out(H * D);
  std::vector<int32_t> bt(2 * NB);
  for (int i = 0; i < 2 * NB; ++i) bt[i] = (i * 97) % NB;
  std::vector<float> small(3 << 18, 1.f);
  auto evict_small = [&]() {
    parallel_for(2, [&](int t, int) {
      float s = 0; const size_t n = small.size() / 2;
      for (size_t i = t * n; i < (t + 1) * n; i += 16) s += small[i];
      sink = s;
    });
  };
  const int32_t seq_len = context, qsl[2] = {0, 1};
  int table_at = 0;
  auto params = [&](int kv_heads) {
    PagedAttentionParams p;
    p.out = out.data(); p.query = query.data();
    p.block_tables = bt.data() + table_at; p.seq_lens = &seq_len; p.query_start_loc = qsl;
    p.num_seqs = 1; p.num_tokens = 1; p.num_heads = 3 * kv_heads; p.num_kv_heads = kv_heads; p.head_size = D;
    p.num_blocks = NB; p.kv_block_stride = block_stride; p.block_size = BS; p.max_blocks_per_seq = NB / 2;
    p.q_stride_token = p.out_stride_token = H * D; p.q_stride_head = p.out_stride_head = D;
    p.q_dtype = DType::kFloat32; p.cache_dtype = DType::kBFloat16; p.scale = 0.125f;
    p.max_query_len = 1; p.max_seq_len = context;
    return p;
  };
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  set_attention_tuning({0, 64, 0});
  for (int round = 0; round < 3; ++round) {
    std::vector<double> one, per_head, interleaved;
    for (int it = 0; it < 300; ++it) {
      const int l = (it * 7) % L;
      table_at = (it * 24) % NB;
      const int64_t lo = l * 2 * plane;  // the layer's offset in a block
      // (a) block-major, one call over 3 kv heads
      PagedAttentionParams p = params(3);
      p.key_cache = base + lo; p.value_cache = base + lo + plane;
      evict_small(); double t0 = now(); paged_attention(p); one.push_back(now() - t0);
      // (b) block-major, one call per kv head (K plane of head h at + h * BS * D, V at + plane + h * BS * D)
      const int l2 = (l + 10) % L;
      evict_small(); t0 = now();
      for (int h = 0; h < Hkv; ++h) {
        PagedAttentionParams q = params(1);
        q.query = query.data() + h * 3 * D; q.out = out.data() + h * 3 * D;
        q.key_cache = base + l2 * 2 * plane + h * BS * D;
        q.value_cache = base + l2 * 2 * plane + plane + h * BS * D;
        paged_attention(q);
      }
      per_head.push_back(now() - t0);
      // (c) head-interleaved: head h's K at + h * 2 * BS * D, its V right after (one 4 KB page)
      const int l3 = (l + 20) % L;
      evict_small(); t0 = now();
      for (int h = 0; h < Hkv; ++h) {
        PagedAttentionParams q = params(1);
        q.query = query.data() + h * 3 * D; q.out = out.data() + h * 3 * D;
        q.key_cache = base + l3 * 2 * plane + h * 2 * BS * D;
        q.value_cache = base + l3 * 2 * plane + h * 2 * BS * D + BS * D;
        paged_attention(q);
      }
      interleaved.push_back(now() - t0);
    }
    printf("ctx %d (%s): block-major one call %.2f us; per-head calls: block-major %.2f us, "
           "head-interleaved %.2f us\n",
           context, active_threading() == Threading::kPool ? "pool" : "openmp", med(one) * 1e6, med(per_head) * 1e6,
           med(interleaved) * 1e6);
  }
}
