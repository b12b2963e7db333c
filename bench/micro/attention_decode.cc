// paged_attention for one decode token at the default model's shapes (9 query heads over 3 kv heads,
// head_dim 64, a bf16 cache, an fp32 query), K/V warm in the caches: microseconds a call per ISA.
//   attention_decode [context=160] [threads=2] [calls=5000]
// Build as README.md says; to compare two versions, build against both libraries and alternate runs.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/paged_attention.h"

using namespace pagedcore::kernels;

int main(int argc, char** argv) {
  const int context = argc > 1 ? std::atoi(argv[1]) : 160;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int calls = argc > 3 ? std::atoi(argv[3]) : 5000;
  constexpr int H = 9, Hkv = 3, D = 64, kBlockSize = 16, kBlocks = 320;  // room for 5120 positions
  if (context < 1 || context > kBlocks * kBlockSize) {
    std::fprintf(stderr, "context must be 1..%d\n", kBlocks * kBlockSize);
    return 1;
  }
  omp_set_num_threads(threads);
  std::vector<uint16_t> key_cache(kBlocks * Hkv * kBlockSize * D, 0x3f80);  // [blocks, Hkv, bs, D] bf16 1.0
  std::vector<uint16_t> value_cache(key_cache.size(), 0x3f80);
  std::vector<float> query(H * D, 0.1f), out(H * D);                         // [1, H, D]
  std::vector<int32_t> block_table(kBlocks);                                 // [1, kBlocks], scattered
  for (int i = 0; i < kBlocks; ++i) block_table[i] = (i * 7) % kBlocks;
  const int32_t seq_len = context, query_start_loc[2] = {0, 1};

  PagedAttentionParams p;
  p.out = out.data();
  p.query = query.data();
  p.key_cache = key_cache.data();
  p.value_cache = value_cache.data();
  p.block_tables = block_table.data();
  p.seq_lens = &seq_len;
  p.query_start_loc = query_start_loc;
  p.num_seqs = 1;
  p.num_tokens = 1;
  p.num_heads = H;
  p.num_kv_heads = Hkv;
  p.head_size = D;
  p.num_blocks = kBlocks;
  p.block_size = kBlockSize;
  p.max_blocks_per_seq = kBlocks;
  p.q_stride_token = p.out_stride_token = H * D;
  p.q_stride_head = p.out_stride_head = D;
  p.q_dtype = DType::kFloat32;
  p.cache_dtype = DType::kBFloat16;
  p.scale = 0.125f;
  for (Isa isa : {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2, Isa::kGeneric16}) {
    if (!isa_supported(isa)) continue;
    for (int i = 0; i < 200; ++i) paged_attention(p, isa);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) paged_attention(p, isa);
    const double us = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls * 1e6;
    std::printf("context %d, %d threads, %s: %.2f us a call\n", context, threads, isa_name(isa), us);
  }
  return 0;
}
