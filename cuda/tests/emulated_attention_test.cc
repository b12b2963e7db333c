// The CUDA paged-attention kernel on the CPU emulator (emulator.h) against a naive double-precision
// reference: random non-contiguous block tables, GQA and MQA, head sizes 64/128/256, block sizes
// 16/32, mixed decode + prefill batches, forced and planned context partitions, both prefill
// variants, all three dtypes, both thread orders (a missing barrier reads unwritten data in one of
// them); and its argument checks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "emulated_test_support.h"
#include "paged_attention_cuda.h"

namespace pagedcore {
namespace cuda {
namespace emulated_test {

struct AttentionCase {
  std::string name;
  std::vector<std::pair<int, int>> seqs;  // (context_len, q_len)
  int num_heads, num_kv_heads, head_size, block_size;
  DType cache_dtype, q_dtype;
  AttentionTuning tuning;
  double tolerance;
  bool known_bounds = true;  // pass max_query_len / max_seq_len
};

void run_attention(const AttentionCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int num_seqs = static_cast<int>(c.seqs.size());
  std::vector<int> blocks_per_seq, seq_lens, qsl{0};
  int total_blocks = 0, max_blocks = 0, max_seq_len = 0, max_query_len = 0;
  for (auto [ctx, q] : c.seqs) {
    const int len = ctx + q;
    const int nb = (len + c.block_size - 1) / c.block_size;
    blocks_per_seq.push_back(nb);
    seq_lens.push_back(len);
    qsl.push_back(qsl.back() + q);
    total_blocks += nb;
    max_blocks = std::max(max_blocks, nb);
    max_seq_len = std::max(max_seq_len, len);
    max_query_len = std::max(max_query_len, q);
  }
  const int num_blocks = total_blocks + 5;
  const int max_blocks_per_seq = max_blocks + 2;  // padded columns, -1
  const int num_tokens = qsl.back();
  std::vector<int> ids(static_cast<size_t>(num_blocks));
  for (int i = 0; i < num_blocks; ++i) ids[static_cast<size_t>(i)] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> block_tables(static_cast<size_t>(num_seqs * max_blocks_per_seq), kNullBlock);
  int at = 0;
  for (int s = 0; s < num_seqs; ++s) {
    for (int b = 0; b < blocks_per_seq[static_cast<size_t>(s)]; ++b) {
      block_tables[static_cast<size_t>(s * max_blocks_per_seq + b)] = ids[static_cast<size_t>(at++)];
    }
  }
  const int H = c.num_heads, KH = c.num_kv_heads, D = c.head_size, BS = c.block_size;
  const size_t cache_elems = static_cast<size_t>(num_blocks) * KH * BS * D;
  Buffer key_cache(c.cache_dtype, cache_elems), value_cache(c.cache_dtype, cache_elems);
  for (size_t i = 0; i < cache_elems; ++i) {  // slots no sequence owns hold NaN: reading one poisons the output
    key_cache.set(i, NAN);
    value_cache.set(i, NAN);
  }
  auto cache_index = [&](int s, int pos, int kvh, int d) {
    const int block = block_tables[static_cast<size_t>(s * max_blocks_per_seq + pos / BS)];
    return ((static_cast<size_t>(block) * KH + kvh) * BS + pos % BS) * D + d;
  };
  for (int s = 0; s < num_seqs; ++s) {
    for (int pos = 0; pos < seq_lens[static_cast<size_t>(s)]; ++pos) {
      for (int kvh = 0; kvh < KH; ++kvh) {
        for (int d = 0; d < D; ++d) {
          key_cache.set(cache_index(s, pos, kvh, d), normal(rng));
          value_cache.set(cache_index(s, pos, kvh, d), normal(rng));
        }
      }
    }
  }
  // query: the middle third of a fused [T, 3H, D] buffer; out: [T, H + 1, D] with a spare head per row.
  Buffer qkv(c.q_dtype, static_cast<size_t>(num_tokens) * 3 * H * D);
  for (size_t i = 0; i < static_cast<size_t>(num_tokens) * 3 * H * D; ++i) qkv.set(i, normal(rng));
  const int64_t q_stride_token = 3 * H * D, q_stride_head = D, q_offset = static_cast<int64_t>(H) * D;
  Buffer out(c.q_dtype, static_cast<size_t>(num_tokens) * (H + 1) * D);
  const float sentinel = round_to(c.q_dtype, 12345.f);
  for (size_t i = 0; i < static_cast<size_t>(num_tokens) * (H + 1) * D; ++i) out.set(i, sentinel);
  const int64_t out_stride_token = static_cast<int64_t>(H + 1) * D, out_stride_head = D;

  PagedAttentionParams p;
  p.out = out.data();
  p.query = static_cast<unsigned char*>(qkv.data()) + q_offset * dtype_size(c.q_dtype);
  p.key_cache = key_cache.data();
  p.value_cache = value_cache.data();
  p.block_tables = block_tables.data();
  p.seq_lens = seq_lens.data();
  p.query_start_loc = qsl.data();
  p.num_seqs = num_seqs;
  p.num_tokens = num_tokens;
  p.num_heads = H;
  p.num_kv_heads = KH;
  p.head_size = D;
  p.num_blocks = num_blocks;
  p.block_size = BS;
  p.max_blocks_per_seq = max_blocks_per_seq;
  p.q_stride_token = q_stride_token;
  p.q_stride_head = q_stride_head;
  p.out_stride_token = out_stride_token;
  p.out_stride_head = out_stride_head;
  p.q_dtype = c.q_dtype;
  p.cache_dtype = c.cache_dtype;
  p.scale = 1.f / std::sqrt(static_cast<float>(D));
  if (c.known_bounds) {
    p.max_query_len = max_query_len;
    p.max_seq_len = max_seq_len;
  }
  p.tuning = c.tuning;
  const std::string problem = check_paged_attention(p);
  EXPECT(problem.empty(), "%s: %s", c.name.c_str(), problem.c_str());
  std::vector<unsigned char> workspace(static_cast<size_t>(paged_attention_workspace_bytes(p)) + 16);
  p.workspace = workspace.data();
  p.workspace_bytes = static_cast<int64_t>(workspace.size());
  EXPECT(paged_attention(p) == cudaSuccess, "%s: launch failed", c.name.c_str());

  // Reference, in double, from the stored (rounded) inputs.
  const int group = H / KH;
  // out is stored in the query dtype: its rounding adds to the kernel's own error.
  const double tolerance =
      c.tolerance + (c.q_dtype == DType::kBFloat16 ? 8e-3 : c.q_dtype == DType::kFloat16 ? 1e-3 : 0.0);
  double max_err = 0.0;
  int bad = 0, outside = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const int q_len = qsl[static_cast<size_t>(s) + 1] - qsl[static_cast<size_t>(s)];
    const int len = seq_lens[static_cast<size_t>(s)];
    for (int j = 0; j < q_len; ++j) {
      const int token = qsl[static_cast<size_t>(s)] + j;
      const int pos = len - q_len + j;
      for (int h = 0; h < H; ++h) {
        const int kvh = h / group;
        std::vector<double> scores(static_cast<size_t>(pos) + 1);
        double mx = -1e300;
        for (int k = 0; k <= pos; ++k) {
          double dot = 0;
          for (int d = 0; d < D; ++d) {
            dot += static_cast<double>(qkv.get(static_cast<size_t>(token * q_stride_token + q_offset + h * q_stride_head + d))) *
                   key_cache.get(cache_index(s, k, kvh, d));
          }
          scores[static_cast<size_t>(k)] = dot * p.scale;
          mx = std::max(mx, scores[static_cast<size_t>(k)]);
        }
        double sum = 0;
        for (auto& e : scores) sum += (e = std::exp(e - mx));
        for (int d = 0; d < D; ++d) {
          double want = 0;
          for (int k = 0; k <= pos; ++k) want += scores[static_cast<size_t>(k)] * value_cache.get(cache_index(s, k, kvh, d));
          want /= sum;
          const double got = out.get(static_cast<size_t>(token * out_stride_token + h * out_stride_head + d));
          const double err = std::fabs(got - want);
          max_err = std::max(max_err, std::isnan(err) ? 1e30 : err);
          if (!(err <= tolerance * (1.0 + std::fabs(want))) && bad++ < 5) {
            std::fprintf(stderr, "  %s: seq %d row %d head %d dim %d: got %g want %g\n", c.name.c_str(), s, j, h, d, got, want);
          }
        }
      }
      for (int d = 0; d < D; ++d) {  // the spare head after the last one is never written
        outside += out.get(static_cast<size_t>(token * out_stride_token + H * out_stride_head + d)) != sentinel;
      }
    }
  }
  EXPECT(bad == 0, "%s: %d elements off (max error %g, tolerance %g)", c.name.c_str(), bad, max_err, tolerance);
  EXPECT(outside == 0, "%s: %d elements written outside the rows' heads", c.name.c_str(), outside);
  std::printf("%-60s max error %.2e\n", c.name.c_str(), max_err);
}

AttentionTuning tuning(int64_t partition_size, int prefill, int decode) {
  AttentionTuning t;
  t.partition_size = partition_size;
  t.prefill = prefill;
  t.decode = decode;
  return t;
}

void test_attention() {
  const DType f32 = DType::kFloat32, bf16 = DType::kBFloat16, f16 = DType::kFloat16;
  constexpr double kExact = 2e-5;  // fp32 math on both sides, different summation order
  constexpr double kRounded = 3e-2;  // P (and a fp32 query) rounded to 16 bits for the tensor cores
  std::vector<AttentionCase> cases = {
      {"decode fp32 d64 bs16 gqa2 planned partitions", {{0, 1}, {16, 1}, {99, 1}, {299, 1}}, 4, 2, 64, 16, f32, f32,
       tuning(0, 0, 0), kExact},
      {"decode bf16 d128 bs32 gqa8 partition 64", {{40, 1}, {200, 1}, {5, 1}}, 8, 1, 128, 32, bf16, bf16,
       tuning(64, 0, 0), kExact},
      {"decode fp16 d256 bs16 gqa3 single partition", {{30, 1}, {77, 1}}, 6, 2, 256, 16, f16, f16,
       tuning(1024, 0, 0), kExact},
      {"decode fp16 d64 bs16 gqa12 (two head chunks) q fp32", {{50, 1}, {130, 1}}, 12, 1, 64, 16, f16, f32,
       tuning(48, 0, 0), kExact},
      {"decode bf16 d64 bs16 mha, unknown bounds", {{10, 1}, {33, 1}, {0, 1}}, 2, 2, 64, 16, bf16, bf16,
       tuning(32, 0, 0), kExact, false},
      {"mixed bf16 d64 bs16 gqa4 tensor cores", {{0, 37}, {20, 1}, {50, 19}, {0, 1}, {5, 0}, {70, 5}}, 8, 2, 64, 16,
       bf16, bf16, tuning(0, 0, 0), kRounded},
      {"mixed fp32 d128 bs32 gqa2 cuda cores", {{0, 21}, {40, 1}, {33, 40}, {3, 0}}, 4, 2, 128, 32, f32, f32,
       tuning(0, 0, 0), kExact},
      {"mixed bf16 d64 bs16 gqa4 cuda cores", {{0, 37}, {20, 1}, {50, 19}, {70, 5}}, 8, 2, 64, 16, bf16, bf16,
       tuning(0, 2, 0), kExact},
      {"all rows on the tile kernel fp16 d128 tensor cores", {{0, 9}, {45, 1}, {17, 1}, {60, 3}}, 4, 1, 128, 32, f16,
       f16, tuning(0, 1, 1), kRounded},
      {"prefill bf16 d256 bs16 long context tensor cores", {{150, 70}}, 2, 1, 256, 16, bf16, bf16, tuning(0, 0, 0),
       kRounded},
      {"prefill bf16 d64 gqa16 (4 tokens per tile) q fp32", {{12, 11}, {0, 6}}, 16, 1, 64, 16, bf16, f32,
       tuning(0, 0, 0), kRounded},
      {"prefill fp16 d64 gqa80 (two head chunks per tile)", {{3, 3}}, 80, 1, 64, 32, f16, f16, tuning(0, 0, 0),
       kRounded},
      {"prefill fp32 d256 bs32 cuda cores", {{31, 33}, {0, 2}}, 2, 2, 256, 32, f32, f32, tuning(0, 0, 0), kExact},
  };
  uint64_t seed = 1;
  for (const AttentionCase& c : cases) run_attention(c, seed++);
  emu::set_order(emu::Order::kReverse);
  for (const AttentionCase& c : {cases[1], cases[5], cases[7]}) {
    AttentionCase r = c;
    r.name += " [reverse order]";
    run_attention(r, seed++);
  }
  emu::set_order(emu::Order::kForward);
}

void test_checks() {
  PagedAttentionParams p;
  p.num_seqs = 1;
  p.num_tokens = 1;
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.head_size = 96;
  p.block_size = 16;
  p.max_blocks_per_seq = 1;
  EXPECT(check_paged_attention(p).find("head_size 96") != std::string::npos, "head_size 96 accepted");
  p.head_size = 64;
  p.block_size = 24;
  EXPECT(check_paged_attention(p).find("power of two") != std::string::npos, "block_size 24 accepted");
  p.block_size = 16;
  p.num_heads = 5;
  EXPECT(!check_paged_attention(p).empty(), "5 heads over 2 kv heads accepted");
  p.num_heads = 4;
  EXPECT(paged_attention(p) == cudaErrorInvalidValue, "null pointers accepted");
  std::printf("%-60s ok\n", "argument checks");
}

}  // namespace emulated_test
}  // namespace cuda
}  // namespace pagedcore
