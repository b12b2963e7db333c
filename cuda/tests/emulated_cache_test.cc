// The CUDA cache kernels on the CPU emulator (emulator.h) against a naive reference: reshape_and_cache
// into random slots in every dtype pair, and block copies and swaps.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cache_kernels_cuda.h"
#include "emulated_test_support.h"

namespace pagedcore {
namespace cuda {
namespace emulated_test {

void test_reshape_and_cache() {
  const DType types[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (DType src : types) {
    for (DType dst : types) {
      const int T = 23, KH = 3, D = 64, NB = 9, BS = 16;
      const int heads_total = 9 + 2 * KH;  // key and value are slices of a fused [T, 9 + 2 KH, D] buffer
      Buffer qkv(src, static_cast<size_t>(T) * heads_total * D);
      for (size_t i = 0; i < static_cast<size_t>(T) * heads_total * D; ++i) qkv.set(i, normal(rng));
      std::vector<int64_t> slots(static_cast<size_t>(NB * BS));
      for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int64_t>(i);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(T);
      slots[3] = kPadSlot;
      slots[11] = kPadSlot;
      slots[12] = NB * BS + 4;  // out of range: written nowhere
      Buffer kc(dst, static_cast<size_t>(NB) * KH * BS * D), vc(dst, static_cast<size_t>(NB) * KH * BS * D);
      for (size_t i = 0; i < static_cast<size_t>(NB) * KH * BS * D; ++i) {
        kc.set(i, -1000.f);  // exact in all three dtypes, out of reach of the N(0, 3) inputs
        vc.set(i, -1000.f);
      }
      ReshapeAndCacheParams p;
      const size_t es = static_cast<size_t>(dtype_size(src));
      p.key = static_cast<unsigned char*>(qkv.data()) + 9 * D * es;
      p.value = static_cast<unsigned char*>(qkv.data()) + (9 + KH) * D * es;
      p.key_cache = kc.data();
      p.value_cache = vc.data();
      p.slot_mapping = slots.data();
      p.num_tokens = T;
      p.num_kv_heads = KH;
      p.head_size = D;
      p.num_blocks = NB;
      p.block_size = BS;
      p.key_stride_token = p.value_stride_token = heads_total * D;
      p.key_stride_head = p.value_stride_head = D;
      p.src_dtype = src;
      p.cache_dtype = dst;
      EXPECT(reshape_and_cache(p) == cudaSuccess, "reshape_and_cache launch");
      int written = 0, wrong = 0;
      for (int t = 0; t < T; ++t) {
        const int64_t slot = slots[static_cast<size_t>(t)];
        if (slot < 0 || slot >= NB * BS) continue;
        for (int h = 0; h < KH; ++h) {
          for (int d = 0; d < D; ++d) {
            const size_t at = ((static_cast<size_t>(slot / BS) * KH + h) * BS + slot % BS) * D + d;
            const float k = qkv.get(static_cast<size_t>(t * heads_total + 9 + h) * D + d);
            const float v = qkv.get(static_cast<size_t>(t * heads_total + 9 + KH + h) * D + d);
            wrong += kc.get(at) != round_to(dst, k) || vc.get(at) != round_to(dst, v);
            ++written;
          }
        }
      }
      int untouched = 0;
      for (size_t i = 0; i < static_cast<size_t>(NB) * KH * BS * D; ++i) untouched += kc.get(i) == -1000.f;
      EXPECT(wrong == 0, "reshape_and_cache %s -> %s: %d elements differ", dtype_name(src), dtype_name(dst), wrong);
      EXPECT(untouched == NB * KH * BS * D - written, "reshape_and_cache %s -> %s wrote outside its slots: %d untouched, %d written of %d", dtype_name(src), dtype_name(dst), untouched, written, NB * KH * BS * D);
    }
  }
  std::printf("%-60s ok\n", "reshape_and_cache, 9 dtype pairs");
}

void test_copy_and_swap() {
  const int planes = 4, NB = 10, block_bytes = 96;  // 96: vectorised path; 6 bytes: byte path below
  for (int bytes : {block_bytes, 6}) {
    std::vector<unsigned char> cache(static_cast<size_t>(planes * NB * bytes));
    for (size_t i = 0; i < cache.size(); ++i) cache[i] = static_cast<unsigned char>(i * 7 + 3);
    std::vector<unsigned char> want = cache;
    // A chain: 1 -> 2, then 2 -> 3 must copy the new block 2; 5 -> 6 and 7 -> 5 (write after read).
    const std::vector<int32_t> rows = {1, 2, 2, 3, 5, 6, 7, 5, 0, 9};
    for (size_t r = 0; r < rows.size() / 2; ++r) {
      for (int pl = 0; pl < planes; ++pl) {
        std::memcpy(&want[static_cast<size_t>((pl * NB + rows[2 * r + 1]) * bytes)],
                    &want[static_cast<size_t>((pl * NB + rows[2 * r]) * bytes)], static_cast<size_t>(bytes));
      }
    }
    CopyBlocksParams p;
    p.src = p.dst = cache.data();
    p.block_mapping = rows.data();
    p.block_mapping_host = rows.data();
    p.num_pairs = static_cast<int64_t>(rows.size() / 2);
    p.num_planes = planes;
    p.src_num_blocks = p.dst_num_blocks = NB;
    p.block_bytes = bytes;
    EXPECT(copy_blocks(p) == cudaSuccess, "copy_blocks launch");
    EXPECT(cache == want, "copy_blocks with chained rows (%d-byte blocks) differs from the rows applied in order", bytes);
  }
  {
    // swap: src 10 blocks, dst 6 blocks; rows (2,0) (3,1) (4,2) merge into one strided copy.
    const int SB = 10, DB = 6;
    std::vector<unsigned char> src(static_cast<size_t>(planes * SB * block_bytes)), dst(static_cast<size_t>(planes * DB * block_bytes), 0);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 13 + 1);
    std::vector<unsigned char> want = dst;
    const std::vector<int32_t> rows = {2, 0, 3, 1, 4, 2, 9, 5, 0, 4};
    for (size_t r = 0; r < rows.size() / 2; ++r) {
      for (int pl = 0; pl < planes; ++pl) {
        std::memcpy(&want[static_cast<size_t>((pl * DB + rows[2 * r + 1]) * block_bytes)],
                    &src[static_cast<size_t>((pl * SB + rows[2 * r]) * block_bytes)], static_cast<size_t>(block_bytes));
      }
    }
    CopyBlocksParams p;
    p.src = src.data();
    p.dst = dst.data();
    p.block_mapping = rows.data();
    p.num_pairs = static_cast<int64_t>(rows.size() / 2);
    p.num_planes = planes;
    p.src_num_blocks = SB;
    p.dst_num_blocks = DB;
    p.block_bytes = block_bytes;
    EXPECT(swap_blocks(p) == cudaSuccess, "swap_blocks");
    EXPECT(dst == want, "swap_blocks differs from the rows applied in order");
    const std::vector<int32_t> bad = {2, 0, 3, 6};
    EXPECT(!check_block_mapping(bad.data(), 2, SB, DB).empty(), "an out-of-range dst id passes the check");
    p.block_mapping = bad.data();
    p.num_pairs = 2;
    EXPECT(swap_blocks(p) == cudaErrorInvalidValue, "swap_blocks accepts an out-of-range id");
  }
  std::printf("%-60s ok\n", "copy_blocks (in-order waves), swap_blocks (merged runs)");
}

}  // namespace emulated_test
}  // namespace cuda
}  // namespace pagedcore
