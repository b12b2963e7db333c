// CPU kernels against naive C++ loops: paged attention over random shuffled block tables (every
// ISA this CPU runs, fp32 and bf16 caches, GQA, mixed decode/prefill, forced partitions),
// reshape_and_cache rounding and padding, copy_blocks order, and the launchers' error statuses.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "attention_batch.h"
#include "check.h"
#include "kernels/cache_kernels.h"
#include "kernels/paged_attention.h"
#include "kernels/parallel.h"

using namespace pagedcore::kernels;
using namespace pagedcore_test;

namespace {


void check_all_isas(const Batch& b) {
  const float scale = 1.f / std::sqrt(static_cast<float>(b.head_size));
  const std::vector<float> want = naive_attention(b, scale);
  for (int code = 0; code < kNumIsas; ++code) {
    const Isa isa = static_cast<Isa>(code);
    if (!isa_supported(isa)) continue;
    for (bool bf16_cache : {false, true}) {
      std::vector<float> out(b.query.size(), std::numeric_limits<float>::quiet_NaN());
      const DType cache_dtype = bf16_cache ? DType::kBFloat16 : DType::kFloat32;
      const Status st = paged_attention(params_for(b, cache_dtype, out.data(), scale), isa);
      CHECK(st.is_ok());
      const float err = max_abs_diff(out, want);
      // The pair-dot tiles (attention_dot_tiles.h) round the fp32 query and the probabilities to
      // bf16 over a bf16 cache: 8e-3, as tests/kernels/test_attention_bf16dot.py.
      const bool pair_dot = bf16_cache && b.head_size % 32 == 0 &&
                            (isa == Isa::kAvx512Bf16 || isa == Isa::kGeneric16Bf16 || isa == Isa::kAmxBf16 ||
                             isa == Isa::kAmxInt8);
      if (!(err < (pair_dot ? 8e-3f : 2e-5f)))
        throw pagedcore_test::Failure(std::string("isa ") + isa_name(isa) + (bf16_cache ? " bf16" : " fp32") +
                                      ": max abs error " + std::to_string(err));
    }
  }
}

// The same batch in a block-major model cache's layer: block i at i * layers * 2 blocks, the other
// layers' planes NaN (any read of them shows).
Batch in_block_major_layer(const Batch& b, int64_t layers, int64_t layer) {
  Batch s = b;
  const int64_t block = b.num_kv_heads * b.block_size * b.head_size;
  s.kv_block_stride = layers * 2 * block;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  s.key_cache.assign(b.num_blocks * s.kv_block_stride, nan);
  s.value_cache = s.key_cache;
  for (int64_t i = 0; i < b.num_blocks; ++i) {
    std::copy_n(&b.key_cache[i * block], block, &s.key_cache[i * s.kv_block_stride + layer * 2 * block]);
    std::copy_n(&b.value_cache[i * block], block, &s.value_cache[i * s.kv_block_stride + layer * 2 * block]);
  }
  s.key_cache_bf16.clear();
  s.value_cache_bf16.clear();
  for (float f : s.key_cache) s.key_cache_bf16.push_back(float_to_bf16(f));
  for (float f : s.value_cache) s.value_cache_bf16.push_back(float_to_bf16(f));
  // key_cache / value_cache point at the layer's first plane, as kv_cache[layer, 0/1] does.
  s.key_cache.erase(s.key_cache.begin(), s.key_cache.begin() + layer * 2 * block);
  s.value_cache.erase(s.value_cache.begin(), s.value_cache.begin() + layer * 2 * block);
  s.key_cache_bf16.erase(s.key_cache_bf16.begin(), s.key_cache_bf16.begin() + layer * 2 * block);
  s.value_cache_bf16.erase(s.value_cache_bf16.begin(), s.value_cache_bf16.begin() + layer * 2 * block);
  return s;
}

}  // namespace

TEST(attention_reads_a_block_major_layer) {
  const Batch b = make_batch(kMixed, 9, 3, 64, 16, 11);
  check_all_isas(in_block_major_layer(b, 3, 1));
  check_all_isas(in_block_major_layer(b, 2, 0));
  Batch bad = in_block_major_layer(b, 3, 1);
  std::vector<float> out(b.query.size());
  PagedAttentionParams p = params_for(bad, DType::kFloat32, out.data(), 0.125f);
  p.kv_block_stride = 3 * 16 * 64 - 1;  // shorter than a block
  CHECK_EQ(paged_attention(p).code, Status::kInvalidArgument);
}

TEST(attention_matches_naive_gqa_1_3_4) {
  check_all_isas(make_batch(kMixed, 4, 4, 64, 16, 1));
  check_all_isas(make_batch(kMixed, 9, 3, 64, 16, 2));
  check_all_isas(make_batch(kMixed, 8, 2, 128, 32, 3));
}

TEST(attention_odd_head_and_block_sizes) {
  check_all_isas(make_batch({{9, 1}, {20, 13}}, 4, 2, 72, 16, 4));
  check_all_isas(make_batch({{9, 1}, {20, 13}}, 2, 1, 256, 8, 5));
  check_all_isas(make_batch({{50, 1}, {7, 30}}, 6, 3, 80, 24, 6));
}

TEST(attention_partitions_and_tiny_tiles_change_nothing) {
  const Batch b = make_batch(kMixed, 9, 3, 64, 16, 7);
  set_attention_tuning({3, 1, 64});
  check_all_isas(b);
  set_attention_tuning({8, 16, 64});
  check_all_isas(b);
  set_attention_tuning({});
}

TEST(attention_both_thread_backends) {
  const Batch b = make_batch({{2000, 1}, {300, 1}}, 9, 3, 64, 16, 8);
  for (Threading t : {Threading::kOpenMP, Threading::kPool}) {
    set_active_threading(t);
    check_all_isas(b);
  }
  set_active_threading(openmp_available() ? Threading::kOpenMP : Threading::kPool);
}

TEST(attention_rejects_bad_indices_and_writes_nothing) {
  Batch b = make_batch({{20, 2}}, 4, 2, 64, 16, 9);
  std::vector<float> out(b.query.size(), 7.f);
  PagedAttentionParams p = params_for(b, DType::kFloat32, out.data(), 0.125f);
  b.block_tables[1] = static_cast<int32_t>(b.num_blocks);  // position 16..21 lives in block 1
  CHECK_EQ(paged_attention(p).code, Status::kOutOfRange);
  b.block_tables[1] = -1;
  CHECK_EQ(paged_attention(p).code, Status::kOutOfRange);
  p.head_size = 12;
  CHECK_EQ(paged_attention(p).code, Status::kInvalidArgument);
  CHECK(std::all_of(out.begin(), out.end(), [](float f) { return f == 7.f; }));
}

TEST(bf16_conversion_rounds_to_nearest_even) {
  CHECK_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3f80);        // tie, even stays
  CHECK_EQ(float_to_bf16(1.0f + 3.0f / 256), 0x3f82);        // tie, odd rounds up
  CHECK_EQ(float_to_bf16(1.0f + 1.0f / 256 + 1e-6f), 0x3f81);  // above the tie
  CHECK_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK_EQ(float_to_bf16(3.4e38f), 0x7f80);  // rounds up to inf, as torch does
}

TEST(reshape_and_cache_writes_slots_and_skips_padding) {
  const int64_t num_blocks = 3, heads = 2, bs = 4, d = 8, tokens = 3;
  // key/value rows with a token stride wider than heads * d (a slice of a fused projection)
  std::vector<float> kv(tokens * 40);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>(i) + 0.5f;
  std::vector<uint16_t> kc(num_blocks * heads * bs * d, 0), vc(kc.size(), 0);
  const std::vector<int64_t> slots = {5, -1, 11};
  ReshapeAndCacheParams p;
  p.key = kv.data();
  p.value = kv.data() + 16;
  p.key_cache = kc.data();
  p.value_cache = vc.data();
  p.slot_mapping = slots.data();
  p.num_tokens = tokens;
  p.num_kv_heads = heads;
  p.head_size = d;
  p.num_blocks = num_blocks;
  p.block_size = bs;
  p.key_stride_token = p.value_stride_token = 40;
  p.key_stride_head = p.value_stride_head = d;
  p.src_dtype = DType::kFloat32;
  p.cache_dtype = DType::kBFloat16;
  CHECK(reshape_and_cache(p).is_ok());
  int64_t written = 0;
  for (uint16_t x : kc) written += x != 0;
  CHECK_EQ(written, 2 * heads * d);
  // token 2 -> slot 11 = block 2, offset 3; head 1, element 5
  CHECK_EQ(kc[((2 * heads + 1) * bs + 3) * d + 5], float_to_bf16(kv[2 * 40 + 1 * d + 5]));
  CHECK_EQ(vc[((1 * heads + 0) * bs + 1) * d + 0], float_to_bf16(kv[0 * 40 + 16]));
  const std::vector<int64_t> bad = {5, 12, 0};
  p.slot_mapping = bad.data();
  CHECK_EQ(reshape_and_cache(p).code, Status::kOutOfRange);
  // A block-major layer: blocks 3 blocks apart; the gaps (other layers) stay untouched.
  std::vector<uint16_t> kb(3 * kc.size(), 0), vb(kb.size(), 0);
  p.slot_mapping = slots.data();
  p.key_cache = kb.data();
  p.value_cache = vb.data();
  p.kv_block_stride = 3 * heads * bs * d;
  CHECK(reshape_and_cache(p).is_ok());
  for (int64_t blk = 0; blk < num_blocks; ++blk)
    for (int64_t i = 0; i < heads * bs * d; ++i) {
      CHECK_EQ(kb[blk * p.kv_block_stride + i], kc[blk * heads * bs * d + i]);
      CHECK_EQ(vb[blk * p.kv_block_stride + i], vc[blk * heads * bs * d + i]);
      for (int64_t gap = 1; gap < 3; ++gap) CHECK_EQ(kb[blk * p.kv_block_stride + gap * heads * bs * d + i], 0);
    }
  p.kv_block_stride = heads * bs * d - 1;
  CHECK_EQ(reshape_and_cache(p).code, Status::kInvalidArgument);
}

TEST(copy_blocks_keeps_row_order_for_chains) {
  const int64_t planes = 4, blocks = 6, bytes = 32;
  std::vector<uint8_t> cache(planes * blocks * bytes);
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = static_cast<uint8_t>(i / bytes);  // block tag
  const std::vector<int32_t> mapping = {1, 2, 2, 3, 5, 1};  // 1->2, then 2->3 (reads the new 2), 5->1
  CopyBlocksParams p;
  p.src = p.dst = cache.data();
  p.block_mapping = mapping.data();
  p.num_pairs = 3;
  p.num_planes = planes;
  p.src_num_blocks = p.dst_num_blocks = blocks;
  p.block_bytes = bytes;
  CHECK(copy_blocks(p).is_ok());
  for (int64_t plane = 0; plane < planes; ++plane) {
    auto tag = [&](int64_t block) { return cache[(plane * blocks + block) * bytes + 7]; };
    CHECK_EQ(int(tag(2)), int(plane * blocks + 1));
    CHECK_EQ(int(tag(3)), int(plane * blocks + 1));
    CHECK_EQ(int(tag(1)), int(plane * blocks + 5));
  }
  const std::vector<int32_t> bad = {0, 6};
  p.block_mapping = bad.data();
  p.num_pairs = 1;
  CHECK_EQ(copy_blocks(p).code, Status::kOutOfRange);
}

TEST(copy_blocks_between_block_major_and_layer_major) {
  const int64_t planes = 4, blocks = 6, bytes = 32;
  // src block-major: block b, plane p at b * planes * bytes + p * bytes; dst layer-major.
  std::vector<uint8_t> src(planes * blocks * bytes), dst(src.size(), 0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t p = 0; p < planes; ++p) std::fill_n(&src[(b * planes + p) * bytes], bytes, uint8_t(10 * b + p));
  const std::vector<int32_t> mapping = {1, 4, 5, 0};
  CopyBlocksParams p;
  p.src = src.data();
  p.dst = dst.data();
  p.block_mapping = mapping.data();
  p.num_pairs = 2;
  p.num_planes = planes;
  p.src_num_blocks = p.dst_num_blocks = blocks;
  p.block_bytes = bytes;
  p.src_plane_stride = bytes;
  p.src_block_stride = planes * bytes;
  CHECK(copy_blocks(p).is_ok());
  for (int64_t plane = 0; plane < planes; ++plane) {
    CHECK_EQ(int(dst[(plane * blocks + 4) * bytes + 3]), int(10 * 1 + plane));
    CHECK_EQ(int(dst[(plane * blocks + 0) * bytes + 31]), int(10 * 5 + plane));
    CHECK_EQ(int(dst[(plane * blocks + 2) * bytes]), 0);
  }
  p.src_block_stride = -1;
  CHECK_EQ(copy_blocks(p).code, Status::kInvalidArgument);
}

TEST(pool_survives_fork) {
  // A forked child must not wait for the parent's pool workers (they do not exist there).
  set_active_threading(Threading::kPool);
  const Batch b = make_batch({{300, 1}, {40, 9}}, 4, 2, 64, 16, 10);
  check_all_isas(b);
  const pid_t child = fork();
  if (child == 0) {
    alarm(20);  // a hang fails the test instead of blocking CTest
    try {
      check_all_isas(b);
    } catch (...) {
      _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  set_active_threading(openmp_available() ? Threading::kOpenMP : Threading::kPool);
}

TEST(pool_runs_a_nested_parallel_for_inline) {
  // The pool takes one job at a time: a parallel_for from inside a task must run its tasks on that
  // thread (as OpenMP's path does in a parallel region), not wait for the pool, which would never free.
  set_active_threading(Threading::kPool);
  std::vector<int> inner_done(8 * 16, 0);
  std::vector<int> inner_thread(8 * 16, -1);
  std::vector<int> outer_thread(8, -1);
  alarm(20);  // a deadlock fails the test instead of blocking CTest
  parallel_for(8, [&](int outer, int thread) {
    outer_thread[outer] = thread;
    parallel_for(16, [&](int inner, int inner_t) {
      ++inner_done[outer * 16 + inner];
      inner_thread[outer * 16 + inner] = inner_t;
    });
  });
  alarm(0);
  for (int i = 0; i < 8 * 16; ++i) {
    CHECK_EQ(inner_done[i], 1);
    CHECK_EQ(inner_thread[i], 0);  // inline: the nested loop's thread index is 0
  }
  for (int t : outer_thread) CHECK(t >= 0 && t < max_threads());
  set_active_threading(openmp_available() ? Threading::kOpenMP : Threading::kPool);
}

int main() { return pagedcore_test::run_all(); }
