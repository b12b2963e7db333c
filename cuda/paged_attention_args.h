// What the host plans for one paged_attention call and hands to the kernels by value (internal to
// cuda/). Sizes that index a single tensor dimension are int; element offsets into whole buffers are
// computed in int64 inside the kernels.
#pragma once

#include <cstdint>

#include "cuda_types.h"

namespace pagedcore {
namespace cuda {
namespace attention {

struct AttentionArgs {
  void* out;                       // [num_tokens, num_heads, head_size], out_stride_*, q_dtype
  const void* query;               // [num_tokens, num_heads, head_size], q_stride_*, q_dtype
  const void* key_cache;           // [num_blocks, num_kv_heads, block_size, head_size], cache dtype
  const void* value_cache;         // same
  const int32_t* block_tables;     // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_lens;         // [num_seqs]
  const int32_t* query_start_loc;  // [num_seqs + 1]
  int num_seqs;
  int num_tokens;
  int num_heads;
  int num_kv_heads;
  int group;                       // num_heads / num_kv_heads: query heads per kv head
  int num_blocks;
  int block_size;                  // a power of two
  int log2_block_size;
  int max_blocks_per_seq;
  int64_t q_stride_token;
  int64_t q_stride_head;
  int64_t out_stride_token;
  int64_t out_stride_head;
  DType q_dtype;
  float scale_log2;                // softmax scale * log2(e): scores live in the log2 domain

  // decode kernel (q_len == 1)
  int decode_heads_per_cta;        // query heads of one kv head that one CTA serves (<= 8)
  int decode_head_chunks;          // ceil(group / decode_heads_per_cta)
  int partition_size;              // context tokens per CTA
  int num_partitions;              // 1: the decode kernel writes `out`; > 1: partials + reduce
  float* partial_out;              // [num_seqs, num_heads, num_partitions, head_size] normalised partial outputs
  float* partial_max;              // [num_seqs, num_heads, num_partitions] log2-domain max score
  float* partial_sum;              // [num_seqs, num_heads, num_partitions] sum of exp2(score - max)

  // prefill (tile) kernel
  int prefill_heads_per_cta;       // query heads of one kv head in one tile's rows
  int prefill_head_chunks;         // ceil(group / prefill_heads_per_cta)
  int prefill_tokens_per_cta;      // query tokens in one tile: rows / prefill_heads_per_cta
  int prefill_min_query_len;       // 2 when the decode kernel takes q_len == 1, else 1
};

// One definition per cache dtype, each in its own .cu file so that they compile in parallel:
// choose the instantiation for the head size (and, for decode, the group bucket: 1, 2, 4 or 8
// query heads per CTA) and launch on `stream`.
cudaError_t launch_decode_f32(const AttentionArgs& args, int head_size, int max_group, cudaStream_t stream);
cudaError_t launch_decode_bf16(const AttentionArgs& args, int head_size, int max_group, cudaStream_t stream);
cudaError_t launch_decode_f16(const AttentionArgs& args, int head_size, int max_group, cudaStream_t stream);
cudaError_t launch_prefill_f32(const AttentionArgs& args, int head_size, bool tensor_cores, cudaStream_t stream);
cudaError_t launch_prefill_bf16(const AttentionArgs& args, int head_size, bool tensor_cores, cudaStream_t stream);
cudaError_t launch_prefill_f16(const AttentionArgs& args, int head_size, bool tensor_cores, cudaStream_t stream);

// Query rows (token x head pairs) of one prefill tile: 16 per warp, 4 warps on tensor cores, 2 on
// CUDA cores (whose fp32 shared-memory tiles are twice as large).
constexpr int prefill_rows_per_cta(bool tensor_cores) { return tensor_cores ? 64 : 32; }
constexpr int kDecodeMaxGroup = 8;
constexpr int kMinTensorCoreMajor = 8;  // compute capability for bf16 wmma; older GPUs take CUDA cores  // query heads one decode CTA holds in registers

}  // namespace attention
}  // namespace cuda
}  // namespace pagedcore
