// paged_attention: checks, the launch plan (which kernels, how many context partitions, how much
// workspace) and the partition-merging reduce kernel. The kernels themselves are in
// paged_attention_decode.cuh and paged_attention_prefill.cuh, instantiated per cache dtype.
#include <climits>
#include <string>

#include "device_common.cuh"
#include "paged_attention_args.h"
#include "paged_attention_cuda.h"
#include "paged_attention_decode.cuh"

namespace pagedcore {
namespace cuda {
namespace attention {

__global__ void __launch_bounds__(kReduceThreads) paged_decode_reduce_kernel(const AttentionArgs a, int head_size) {
  const int seq = blockIdx.x;
  const int head = blockIdx.y;
  DecodeRow row;
  if (!decode_row(a, seq, &row)) return;
  // The decode kernel wrote exactly the partitions that start inside the sequence.
  const int num_used = imin(a.num_partitions, (row.seq_len + a.partition_size - 1) / a.partition_size);
  const int64_t base = (static_cast<int64_t>(seq) * a.num_heads + head) * a.num_partitions;
  PC_SHARED_MEMORY(smem);
  float* weight = reinterpret_cast<float*>(smem);  // [num_partitions]
  float max_all = -INFINITY;
  for (int p = 0; p < num_used; ++p) max_all = fmaxf(max_all, a.partial_max[base + p]);
  for (int p = threadIdx.x; p < num_used; p += kReduceThreads) {
    weight[p] = a.partial_sum[base + p] * exp2f(a.partial_max[base + p] - safe_max(max_all));
  }
  __syncthreads();
  float sum = 0.f;
  for (int p = 0; p < num_used; ++p) sum += weight[p];
  const float inv_sum = sum > 0.f ? 1.f / sum : 0.f;
  const int64_t out_base = row.q_start * a.out_stride_token + static_cast<int64_t>(head) * a.out_stride_head;
  for (int d = threadIdx.x; d < head_size; d += kReduceThreads) {
    float out = 0.f;
    for (int p = 0; p < num_used; ++p) out += weight[p] * a.partial_out[(base + p) * head_size + d];
    store_from_float(a.out, out_base + d, a.q_dtype, out * inv_sum);
  }
}

namespace {

constexpr int64_t kMaxPartitions = 4096;       // the reduce kernel keeps one weight per partition in shared memory
constexpr int64_t kDefaultPartitionSize = 512;
constexpr int64_t kMinPartitionSize = 128;
constexpr int64_t kWorkspaceAlign = 256;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
int next_pow2(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}
bool is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

struct Plan {
  AttentionArgs args{};
  bool run_decode = false;
  bool run_prefill = false;
  bool tensor_cores = false;
  int max_group = 1;
  int64_t partial_out_offset = 0;  // byte offsets into the workspace
  int64_t partial_max_offset = 0;
  int64_t partial_sum_offset = 0;
  int64_t workspace_bytes = 0;
};

// Context tokens per decode CTA. Few (sequence, kv head) pairs leave SMs idle, so their contexts
// are cut finer (down to kMinPartitionSize) until there are about two CTAs per SM; many pairs keep
// 512-token partitions, which bound the work of one CTA (one long sequence among short ones).
int64_t plan_partition_size(int64_t work_items, int64_t max_seq_len, int num_sms) {
  int64_t size = kDefaultPartitionSize;
  while (size > kMinPartitionSize && work_items * ceil_div(max_seq_len, size) < 2 * num_sms) size /= 2;
  while (ceil_div(max_seq_len, size) > kMaxPartitions) size *= 2;
  return size;
}

Plan make_plan(const PagedAttentionParams& p, int num_sms, int cc_major) {
  Plan plan;
  AttentionArgs& a = plan.args;
  a.out = p.out;
  a.query = p.query;
  a.key_cache = p.key_cache;
  a.value_cache = p.value_cache;
  a.block_tables = p.block_tables;
  a.seq_lens = p.seq_lens;
  a.query_start_loc = p.query_start_loc;
  a.num_seqs = static_cast<int>(p.num_seqs);
  a.num_tokens = static_cast<int>(p.num_tokens);
  a.num_heads = static_cast<int>(p.num_heads);
  a.num_kv_heads = static_cast<int>(p.num_kv_heads);
  a.group = static_cast<int>(p.num_heads / p.num_kv_heads);
  a.num_blocks = static_cast<int>(p.num_blocks);
  a.block_size = static_cast<int>(p.block_size);
  a.log2_block_size = ilog2(a.block_size);
  a.max_blocks_per_seq = static_cast<int>(p.max_blocks_per_seq);
  a.q_stride_token = p.q_stride_token;
  a.q_stride_head = p.q_stride_head;
  a.out_stride_token = p.out_stride_token;
  a.out_stride_head = p.out_stride_head;
  a.q_dtype = p.q_dtype;
  a.scale_log2 = p.scale * kLog2e;

  const int64_t table_len = p.max_blocks_per_seq * p.block_size;
  const int64_t max_seq_len = p.max_seq_len >= 0 && p.max_seq_len < table_len ? p.max_seq_len : table_len;
  const int64_t max_query_len = p.max_query_len >= 0 ? p.max_query_len : p.num_tokens;
  const bool decode_kernel = p.tuning.decode == 0;
  plan.run_decode = decode_kernel && max_seq_len > 0;
  plan.run_prefill = !decode_kernel || max_query_len >= 2;
  a.prefill_min_query_len = decode_kernel ? 2 : 1;

  if (plan.run_decode) {
    a.decode_head_chunks = static_cast<int>(ceil_div(a.group, kDecodeMaxGroup));
    a.decode_heads_per_cta = static_cast<int>(ceil_div(a.group, a.decode_head_chunks));
    plan.max_group = next_pow2(a.decode_heads_per_cta);
    const int64_t work_items = p.num_seqs * p.num_kv_heads * a.decode_head_chunks;
    const int64_t size = p.tuning.partition_size > 0 ? p.tuning.partition_size
                                                      : plan_partition_size(work_items, max_seq_len, num_sms);
    a.partition_size = static_cast<int>(size);
    a.num_partitions = static_cast<int>(ceil_div(max_seq_len, size));
    if (a.num_partitions > 1) {
      const int64_t parts = p.num_seqs * p.num_heads * a.num_partitions;
      plan.partial_out_offset = 0;
      plan.partial_max_offset = round_up(parts * p.head_size * 4, kWorkspaceAlign);
      plan.partial_sum_offset = plan.partial_max_offset + round_up(parts * 4, kWorkspaceAlign);
      plan.workspace_bytes = plan.partial_sum_offset + round_up(parts * 4, kWorkspaceAlign);
    }
  }
  if (plan.run_prefill) {
    plan.tensor_cores = p.cache_dtype != DType::kFloat32 && p.tuning.prefill != 2 && cc_major >= kMinTensorCoreMajor;
    const int rows = prefill_rows_per_cta(plan.tensor_cores);
    a.prefill_head_chunks = static_cast<int>(ceil_div(a.group, rows));
    a.prefill_heads_per_cta = static_cast<int>(ceil_div(a.group, a.prefill_head_chunks));
    a.prefill_tokens_per_cta = rows / a.prefill_heads_per_cta;
  }
  return plan;
}

cudaError_t launch_decode(const Plan& plan, const PagedAttentionParams& p, cudaStream_t stream) {
  const int head_size = static_cast<int>(p.head_size);
  switch (p.cache_dtype) {
    case DType::kBFloat16: return launch_decode_bf16(plan.args, head_size, plan.max_group, stream);
    case DType::kFloat16: return launch_decode_f16(plan.args, head_size, plan.max_group, stream);
    default: return launch_decode_f32(plan.args, head_size, plan.max_group, stream);
  }
}

cudaError_t launch_prefill(const Plan& plan, const PagedAttentionParams& p, cudaStream_t stream) {
  const int head_size = static_cast<int>(p.head_size);
  switch (p.cache_dtype) {
    case DType::kBFloat16: return launch_prefill_bf16(plan.args, head_size, plan.tensor_cores, stream);
    case DType::kFloat16: return launch_prefill_f16(plan.args, head_size, plan.tensor_cores, stream);
    default: return launch_prefill_f32(plan.args, head_size, false, stream);
  }
}

}  // namespace
}  // namespace attention

std::string check_paged_attention(const PagedAttentionParams& p) {
  using std::to_string;
  if (p.num_seqs < 0 || p.num_tokens < 0) return "num_seqs and num_tokens must be >= 0";
  if (p.num_seqs > INT_MAX / 2 || p.num_tokens > INT_MAX / 2 || p.num_blocks > INT_MAX) {
    return "num_seqs, num_tokens or num_blocks is beyond the kernels' 32-bit indexing";
  }
  if (p.head_size != 64 && p.head_size != 128 && p.head_size != 256) {
    return "head_size " + to_string(p.head_size) + " is not supported by the CUDA kernels (64, 128 or 256)";
  }
  if (p.num_kv_heads <= 0 || p.num_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return "num_heads " + to_string(p.num_heads) + " must be a positive multiple of num_kv_heads " +
           to_string(p.num_kv_heads);
  }
  if (!attention::is_pow2(p.block_size) || p.block_size > kMaxBlockSize) {
    return "block_size " + to_string(p.block_size) + " must be a power of two up to " + to_string(kMaxBlockSize) +
           " for the CUDA kernels";
  }
  if (p.max_blocks_per_seq < 0 || p.max_blocks_per_seq * p.block_size > INT_MAX / 2) {
    return "max_blocks_per_seq * block_size is beyond the kernels' 32-bit positions";
  }
  const int64_t group = p.num_heads / p.num_kv_heads;
  if (p.num_kv_heads * ((group + attention::kDecodeMaxGroup - 1) / attention::kDecodeMaxGroup) > 65535) {
    return "num_kv_heads " + to_string(p.num_kv_heads) + " is beyond the grid's y limit";
  }
  if (p.num_tokens > 0 && p.num_seqs > 0) {
    if (!p.out || !p.query || !p.key_cache || !p.value_cache || !p.block_tables || !p.seq_lens ||
        !p.query_start_loc) {
      return "a null data pointer";
    }
  }
  if (reinterpret_cast<uintptr_t>(p.key_cache) % 16 != 0 || reinterpret_cast<uintptr_t>(p.value_cache) % 16 != 0) {
    return "key_cache and value_cache must be 16-byte aligned (the kernels load 16 bytes at a time)";
  }
  if (p.tuning.partition_size < 0 || p.tuning.prefill < 0 || p.tuning.prefill > 2 || p.tuning.decode < 0 ||
      p.tuning.decode > 1) {
    return "tuning: partition_size >= 0, prefill in {0, 1, 2}, decode in {0, 1}";
  }
  if (p.tuning.partition_size > 0) {
    const int64_t table_len = p.max_blocks_per_seq * p.block_size;
    if ((table_len + p.tuning.partition_size - 1) / p.tuning.partition_size > attention::kMaxPartitions) {
      return "tuning.partition_size " + to_string(p.tuning.partition_size) + " cuts the context into more than " +
             to_string(attention::kMaxPartitions) + " partitions";
    }
  }
  return std::string();
}

int64_t paged_attention_workspace_bytes(const PagedAttentionParams& p) {
  if (!check_paged_attention(p).empty() || p.num_tokens == 0 || p.num_seqs == 0) return 0;
  return attention::make_plan(p, num_multiprocessors(), compute_capability_major()).workspace_bytes;
}

cudaError_t paged_attention(const PagedAttentionParams& p) {
  if (!check_paged_attention(p).empty()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0 || p.num_seqs == 0) return cudaSuccess;
  attention::Plan plan = attention::make_plan(p, num_multiprocessors(), compute_capability_major());
  if (plan.workspace_bytes > 0) {
    if (p.workspace == nullptr || p.workspace_bytes < plan.workspace_bytes) return cudaErrorInvalidValue;
    char* base = static_cast<char*>(p.workspace);
    plan.args.partial_out = reinterpret_cast<float*>(base + plan.partial_out_offset);
    plan.args.partial_max = reinterpret_cast<float*>(base + plan.partial_max_offset);
    plan.args.partial_sum = reinterpret_cast<float*>(base + plan.partial_sum_offset);
  }
  if (plan.run_decode) {
    cudaError_t status = attention::launch_decode(plan, p, p.stream);
    if (status != cudaSuccess) return status;
    if (plan.args.num_partitions > 1) {
      auto kernel = &attention::paged_decode_reduce_kernel;
      const dim3 grid(static_cast<unsigned>(p.num_seqs), static_cast<unsigned>(p.num_heads));
      const size_t shared_bytes = sizeof(float) * static_cast<size_t>(plan.args.num_partitions);
      const int head_size = static_cast<int>(p.head_size);
      PC_LAUNCH(kernel, grid, dim3(attention::kReduceThreads), shared_bytes, p.stream, plan.args, head_size);
      status = last_launch_error();
      if (status != cudaSuccess) return status;
    }
  }
  if (plan.run_prefill) return attention::launch_prefill(plan, p, p.stream);
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace pagedcore
