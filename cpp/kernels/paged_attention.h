// Paged attention on the CPU: every query row of a mixed batch (decode rows and prefill chunks)
// attends causally to its sequence's cached K/V through the block table.
#pragma once

#include <cstdint>

#include "kernels/cpu_isa.h"
#include "kernels/kernel_types.h"

namespace pagedcore {
namespace kernels {

// Inputs of one call. Sequence s owns query rows [query_start_loc[s], query_start_loc[s + 1]);
// with q_len = that count, its row j sits at position seq_lens[s] - q_len + j and sees the cached
// positions [0, that position] (its own new K/V included: reshape_and_cache ran first).
//
//   query rows:   |-- seq 0 (prefill chunk) --|s1|s2|-- seq 3 chunk --|   (decode rows have q_len 1)
//   seq s keys:   [0 ........ seq_lens[s] - q_len | new rows .. seq_lens[s])
//                  position p lives in block block_tables[s][p / block_size], row p % block_size
//
//   key_cache [num_blocks, num_kv_heads, block_size, head_size]:
//     K of position p, kv head g = key_cache[block_tables[s][p / block_size], g, p % block_size, :]
//   GQA: query head h reads kv head h / (num_heads / num_kv_heads).
struct PagedAttentionParams {
  void* out = nullptr;                    // [num_tokens, num_heads, head_size], out_stride_*, q_dtype
  const void* query = nullptr;            // [num_tokens, num_heads, head_size], q_stride_*, q_dtype
  const void* key_cache = nullptr;        // [num_blocks, num_kv_heads, block_size, head_size], cache_dtype;
                                          // the inner three dims contiguous, blocks kv_block_stride apart
  const void* value_cache = nullptr;      // same shape, strides and dtype as key_cache
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq], contiguous, kNullBlock (-1) padding
  const int32_t* seq_lens = nullptr;      // [num_seqs]: cached tokens including this step's
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1], [0] = 0, [num_seqs] = num_tokens
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;                // num_heads % num_kv_heads == 0
  int64_t head_size = 0;                   // a multiple of 8, at most kMaxHeadSize
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t max_blocks_per_seq = 0;
  // Elements between key_cache[b] and key_cache[b + 1]; 0 = num_kv_heads * block_size * head_size (a
  // contiguous layer cache). A block-major model cache (kv_cache.py) puts every layer's K and V of a
  // block together, so a layer's blocks are num_layers * 2 planes-of-a-block apart.
  int64_t kv_block_stride = 0;
  int64_t q_stride_token = 0;              // elements between query[t] and query[t + 1]
  int64_t q_stride_head = 0;               // elements between query[t, h] and query[t, h + 1]; last dim stride 1
  int64_t out_stride_token = 0;
  int64_t out_stride_head = 0;
  DType q_dtype = DType::kFloat32;         // query and out
  DType cache_dtype = DType::kFloat32;     // key_cache and value_cache
  float scale = 1.f;                       // softmax scale, usually 1 / sqrt(head_size)
  int64_t max_query_len = -1;              // optional upper bounds, checked when >= 0
  int64_t max_seq_len = -1;
};

constexpr int64_t kMaxHeadSize = 256;

// Checks every size, offset and block id the call would touch, then computes `out`. On error
// nothing is written. Uses active_isa() and the threads of parallel.h.
Status paged_attention(const PagedAttentionParams& p);
// The same with a chosen instruction set (tests compare them); kInvalidArgument if unsupported.
Status paged_attention(const PagedAttentionParams& p, Isa isa);

// Work planning knobs, exposed for tests and benchmarks (0 = default).
struct AttentionTuning {
  int64_t max_tile_rows = 0;        // query rows x heads of one kv group per work item (default 64)
  int64_t min_partition_keys = 0;   // shortest key range worth a partition of its own (default 128)
  int64_t items_per_thread = 0;     // split key ranges until there are this many items per thread (4)
};
void set_attention_tuning(const AttentionTuning& tuning);

}  // namespace kernels
}  // namespace pagedcore
