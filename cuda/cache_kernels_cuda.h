// Writing new K/V into the paged cache (reshape_and_cache) and copying whole blocks on the GPU
// (copy_blocks: copy-on-write) or between the GPU cache and the CPU pool (swap_blocks). The contract
// is the CPU kernels' (cpp/kernels/cache_kernels.h); python/pagedcore/ops/attention_cuda.py checks tensors.
#pragma once

#include <cstdint>
#include <string>

#include "cuda_types.h"

namespace pagedcore {
namespace cuda {

// One layer's cache:
//
//   key_cache [num_blocks, num_kv_heads, block_size, head_size]   (contiguous)
//
//   block b ─┬─ kv head 0 ─┬─ slot offset 0: head_size elements
//            │             ├─ slot offset 1
//            │             └─ ... block_size rows
//            └─ kv head 1 ─ ...
//
//   slot s = block * block_size + offset  →  element (s / block_size, head, s % block_size, :)
//
// A slot outside [0, num_blocks * block_size) (kPadSlot = -1 among them) writes nothing: slots
// live on the GPU and are not checked on the host.
struct ReshapeAndCacheParams {
  const void* key = nullptr;              // [num_tokens, num_kv_heads, head_size], strides below, src_dtype
  const void* value = nullptr;            // [num_tokens, num_kv_heads, head_size], strides below, src_dtype
  void* key_cache = nullptr;              // [num_blocks, num_kv_heads, block_size, head_size], contiguous, cache_dtype
  void* value_cache = nullptr;            // same shape and dtype as key_cache
  const int64_t* slot_mapping = nullptr;  // [num_tokens], device memory
  int64_t num_tokens = 0;
  int64_t num_kv_heads = 0;
  int64_t head_size = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t key_stride_token = 0;    // elements between key[t] and key[t + 1]
  int64_t key_stride_head = 0;     // elements between key[t, h] and key[t, h + 1]; the last dim's stride is 1
  int64_t value_stride_token = 0;
  int64_t value_stride_head = 0;
  DType src_dtype = DType::kFloat32;    // key and value
  DType cache_dtype = DType::kFloat32;  // caches; conversions round to nearest even, like torch's .to()
  cudaStream_t stream = nullptr;
};

std::string check_reshape_and_cache(const ReshapeAndCacheParams& p);
cudaError_t reshape_and_cache(const ReshapeAndCacheParams& p);

// Whole blocks of a model's cache, every layer and both K and V:
//
//   kv_cache [num_layers, 2, num_blocks, num_kv_heads, block_size, head_size]
//            └──── plane ───┘└ block ─┘└────────── block_bytes ───────────┘
//
//   block b of plane p starts at byte (p * num_blocks + b) * block_bytes.
struct CopyBlocksParams {
  const void* src = nullptr;                    // [num_planes, src_num_blocks, block_bytes] bytes
  void* dst = nullptr;                          // [num_planes, dst_num_blocks, block_bytes] bytes
  const int32_t* block_mapping = nullptr;       // [num_pairs, 2] (src block, dst block); device memory for
                                                //   copy_blocks, host memory for swap_blocks
  const int32_t* block_mapping_host = nullptr;  // copy_blocks only, optional: the same rows on the host
  int64_t num_pairs = 0;
  int64_t num_planes = 0;                       // num_layers * 2
  int64_t src_num_blocks = 0;
  int64_t dst_num_blocks = 0;
  int64_t block_bytes = 0;                      // num_kv_heads * block_size * head_size * element size
  cudaStream_t stream = nullptr;
};

// Empty when every id of the host rows is in range; else which row is wrong.
std::string check_block_mapping(const int32_t* host_rows, int64_t num_pairs, int64_t src_num_blocks,
                                int64_t dst_num_blocks);

// GPU to GPU (src may equal dst), all pairs and planes in one launch. The rows act in order: when
// block_mapping_host is given, rows that read or write a block an earlier row writes (or write one
// it reads) start a new launch; without it the rows must be independent (distinct destinations, no
// destination read by another row), as copy-on-write lists are. Out-of-range ids copy nothing.
cudaError_t copy_blocks(const CopyBlocksParams& p);

// Between two caches of which one may be in host memory (pinned, or pageable at lower speed), with
// cudaMemcpy2DAsync on p.stream: consecutive rows that step both ids by one become one copy, and
// all planes go in that one strided copy. block_mapping is in host memory and checked here.
cudaError_t swap_blocks(const CopyBlocksParams& p);

}  // namespace cuda
}  // namespace pagedcore
