// Writing new K/V into the paged cache (reshape_and_cache) and copying whole blocks within or
// between caches (copy_blocks: copy-on-write; swap: GPU/CPU pools). Launchers check every index
// before the first store and return a Status; nothing is written on error.
#pragma once

#include <cstdint>

#include "kernels/kernel_types.h"

namespace pagedcore {
namespace kernels {

// One layer's cache, as the model runner allocates it:
//
//   key_cache [num_blocks, num_kv_heads, block_size, head_size]   (inner three dims contiguous; blocks
//                                                                   kv_block_stride elements apart)
//
//   block b ─┬─ kv head 0 ─┬─ slot offset 0: head_size elements
//            │             ├─ slot offset 1
//            │             └─ ... block_size rows
//            └─ kv head 1 ─ ...
//
//   slot s = block * block_size + offset  →  element (s / block_size, head, s % block_size, :)
struct ReshapeAndCacheParams {
  const void* key = nullptr;          // [num_tokens, num_kv_heads, head_size], strides below, src_dtype
  const void* value = nullptr;        // [num_tokens, num_kv_heads, head_size], strides below, src_dtype
  void* key_cache = nullptr;          // [num_blocks, num_kv_heads, block_size, head_size], cache_dtype
  void* value_cache = nullptr;        // same shape, strides and dtype as key_cache
  const int64_t* slot_mapping = nullptr;  // [num_tokens]; kPadSlot (-1) = write nothing
  int64_t num_tokens = 0;
  int64_t num_kv_heads = 0;
  int64_t head_size = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t kv_block_stride = 0;     // elements between key_cache[b] and [b + 1]; 0 = Hkv * block_size * head_size
  int64_t key_stride_token = 0;    // elements between key[t] and key[t + 1]
  int64_t key_stride_head = 0;     // elements between key[t, h] and key[t, h + 1]; last dim stride is 1
  int64_t value_stride_token = 0;
  int64_t value_stride_head = 0;
  DType src_dtype = DType::kFloat32;    // key and value
  DType cache_dtype = DType::kFloat32;  // key_cache and value_cache: fp32, bf16 (rounds to nearest even) or
                                        // fp8 e4m3 / e5m2 (fp8.h: rounds to nearest even, saturates)
};

Status reshape_and_cache(const ReshapeAndCacheParams& p);

// Whole blocks of a model's cache, every layer and both K and V:
//
//   kv_cache [num_layers, 2, num_blocks, num_kv_heads, block_size, head_size]
//            └──── plane ───┘└ block ─┘└────────── block_bytes ───────────┘
//
//   block b of plane p starts at byte p * plane_stride + b * block_stride. Layer-major (contiguous, the
//   default: strides 0): plane_stride = num_blocks * block_bytes, block_stride = block_bytes. Block-major
//   (kv_cache.py's CPU layout): plane_stride = block_bytes, block_stride = num_planes * block_bytes.
struct CopyBlocksParams {
  const void* src = nullptr;              // num_planes x src_num_blocks runs of block_bytes, strides below
  void* dst = nullptr;                    // num_planes x dst_num_blocks runs of block_bytes (may equal src)
  const int32_t* block_mapping = nullptr; // [num_pairs, 2]: (src block, dst block)
  int64_t num_pairs = 0;
  int64_t num_planes = 0;                 // num_layers * 2
  int64_t src_num_blocks = 0;
  int64_t dst_num_blocks = 0;
  int64_t block_bytes = 0;                // num_kv_heads * block_size * head_size * element size
  int64_t src_plane_stride = 0;           // bytes; 0 = src_num_blocks * block_bytes
  int64_t src_block_stride = 0;           // bytes; 0 = block_bytes
  int64_t dst_plane_stride = 0;           // bytes; 0 = dst_num_blocks * block_bytes
  int64_t dst_block_stride = 0;           // bytes; 0 = block_bytes
};

// Within one cache (src == dst) the pairs act in row order: a block written by an earlier pair and
// read by a later one is copied after that write (those calls run on one thread).
Status copy_blocks(const CopyBlocksParams& p);

}  // namespace kernels
}  // namespace pagedcore
