// Paged attention on the GPU for mixed batches: decode rows (one new token) and prefill chunks
// attend causally to their sequence's cached K/V through the block table. The contract is the CPU
// kernel's (cpp/kernels/paged_attention.h); python/pagedcore/ops/attention_cuda.py checks the tensors.
//
// Two kernels share one call, on one stream:
//   decode  (q_len == 1): flash-decoding. One CTA per (sequence, kv head, head chunk, partition of
//           the context); CUDA cores, fp32 online softmax, 16-byte K/V loads; a reduce kernel merges
//           the partitions when there is more than one.
//   prefill (q_len >= 2): tiles of (query token x query head) rows against K/V tiles; tensor cores
//           (wmma, bf16/fp16) or CUDA cores (any dtype; fp32 caches always).
#pragma once

#include <cstdint>
#include <string>

#include "cuda_types.h"

namespace pagedcore {
namespace cuda {

// Which implementation runs what (tests and benchmarks pick; the defaults are the fast ones).
struct AttentionTuning {
  int64_t partition_size = 0;  // decode: context tokens per CTA; 0 = planned from the batch and the SM count
  int32_t prefill = 0;         // 0, 1 = tensor cores for bf16/fp16 caches on sm_80+; 2 = CUDA cores
  int32_t decode = 0;          // 0 = the decode kernel for q_len == 1, 1 = the prefill (tile) kernel for all rows
};

// One call. Sequence s owns query rows [query_start_loc[s], query_start_loc[s + 1]); with q_len
// that count, its row j sits at position seq_lens[s] - q_len + j and sees positions [0, it].
//
//   query rows:   |-- seq 0 (prefill chunk) --|s1|s2|-- seq 3 chunk --|   (decode rows: q_len 1)
//   seq s keys:   [0 ........ seq_lens[s] - q_len | new rows .. seq_lens[s])
//
//   key_cache [num_blocks, num_kv_heads, block_size, head_size]:
//     K of position p, kv head g = key_cache[block_tables[s][p / block_size], g, p % block_size, :]
//   GQA: query head h reads kv head h / (num_heads / num_kv_heads).
//
// Index contents (block ids, lengths, offsets) live on the GPU and are not checked on the host: a
// block id outside [0, num_blocks) masks its keys, a malformed sequence writes nothing, so a bad
// table gives wrong numbers, never an out-of-bounds access.
struct PagedAttentionParams {
  void* out = nullptr;                       // [num_tokens, num_heads, head_size], out_stride_*, q_dtype
  const void* query = nullptr;               // [num_tokens, num_heads, head_size], q_stride_*, q_dtype
  const void* key_cache = nullptr;           // [num_blocks, num_kv_heads, block_size, head_size], contiguous,
                                             //   cache_dtype, 16-byte aligned
  const void* value_cache = nullptr;         // same shape, dtype and alignment as key_cache
  const int32_t* block_tables = nullptr;     // [num_seqs, max_blocks_per_seq], contiguous, kNullBlock padding
  const int32_t* seq_lens = nullptr;         // [num_seqs]: cached tokens including this step's
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1], [0] = 0, non-decreasing, [num_seqs] <= num_tokens
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;      // num_heads % num_kv_heads == 0
  int64_t head_size = 0;         // 64, 128 or 256
  int64_t num_blocks = 0;
  int64_t block_size = 0;        // a power of two, at most 256
  int64_t max_blocks_per_seq = 0;
  int64_t q_stride_token = 0;    // elements between query[t] and query[t + 1]
  int64_t q_stride_head = 0;     // elements between query[t, h] and query[t, h + 1]; the last dim's stride is 1
  int64_t out_stride_token = 0;
  int64_t out_stride_head = 0;
  DType q_dtype = DType::kFloat32;      // query and out
  DType cache_dtype = DType::kFloat32;  // key_cache and value_cache
  float scale = 1.f;                    // softmax scale, usually 1 / sqrt(head_size)
  int64_t max_query_len = -1;  // host-known upper bounds; -1 = unknown (planned from num_tokens and
  int64_t max_seq_len = -1;    //   max_blocks_per_seq * block_size). Must hold when given.
  void* workspace = nullptr;   // device scratch of workspace_bytes (decode partials)
  int64_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  AttentionTuning tuning;
};

constexpr int64_t kMaxBlockSize = 256;

// Empty when the call is valid; otherwise what is wrong and how to fix it.
std::string check_paged_attention(const PagedAttentionParams& p);

// Device scratch the call needs (0 when none): allocate it, set workspace/workspace_bytes, call.
int64_t paged_attention_workspace_bytes(const PagedAttentionParams& p);

// Launches on p.stream. cudaErrorInvalidValue when check_paged_attention fails or the workspace is
// too small; otherwise the launch status. Asynchronous: kernel faults surface at the next sync.
cudaError_t paged_attention(const PagedAttentionParams& p);

}  // namespace cuda
}  // namespace pagedcore
